package kubeapi

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/agentbox/agentbox/internal/kube"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
)

// pageAll pages through views with limit n in one order, as a client
// following X-Next-Token does, and returns the ids in the order received.
func pageAll(t *testing.T, s *Server, team string, views []view, n int, asc bool) []string {
	t.Helper()
	sorted := slices.Clone(views)
	sortViews(sorted, asc)
	q := url.Values{"limit": {fmt.Sprint(n)}}
	if asc {
		q.Set("order", "asc")
	}
	var got []string
	for range len(views) + 2 {
		pq, err := s.parsePage(q, team)
		if err != nil {
			t.Fatalf("parse %v: %v", q, err)
		}
		w := httptest.NewRecorder()
		for _, v := range s.page(w, team, sorted, pq, nil) {
			got = append(got, v.id)
		}
		tok := w.Header().Get("X-Next-Token")
		if tok == "" {
			return got
		}
		q.Set("nextToken", tok)
	}
	t.Fatalf("paging did not end: %v", got)
	return nil
}

func TestListPages(t *testing.T) {
	s := &Server{cfg: Config{TokenSecret: []byte(strings.Repeat("k", 32))}}
	t0 := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	// Creation timestamps have whole seconds: several sandboxes share one.
	var views []view
	for i, sec := range []int{0, 1, 1, 1, 2, 3, 3, 4} {
		views = append(views, view{id: fmt.Sprintf("i%02d", i), started: t0.Add(time.Duration(sec) * time.Second)})
	}
	desc := pageAll(t, s, "a", views, 100, false)
	if len(desc) != len(views) || desc[0] != "i07" || desc[len(desc)-1] != "i00" {
		t.Fatalf("one page, newest first: %v", desc)
	}
	asc := slices.Clone(desc)
	slices.Reverse(asc)
	for _, n := range []int{1, 2, 3, 7, 8} {
		if got := pageAll(t, s, "a", views, n, false); !slices.Equal(got, desc) {
			t.Errorf("limit %d desc: %v, want %v", n, got, desc)
		}
		if got := pageAll(t, s, "a", views, n, true); !slices.Equal(got, asc) {
			t.Errorf("limit %d asc: %v, want %v", n, got, asc)
		}
	}

	sorted := slices.Clone(views)
	sortViews(sorted, false)
	w := httptest.NewRecorder()
	pq, _ := s.parsePage(url.Values{"limit": {"2"}}, "a")
	s.page(w, "a", sorted, pq, nil)
	tok := w.Header().Get("X-Next-Token")
	if tok == "" {
		t.Fatal("no X-Next-Token with more to come")
	}
	payload, mac, _ := strings.Cut(tok, ".")
	forged := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprint(t0.UnixNano()) + "__i00"))
	for _, tc := range []struct {
		name, team string
		q          url.Values
	}{
		{"another team's token", "b", url.Values{"nextToken": {tok}}},
		{"a token without its MAC", "a", url.Values{"nextToken": {payload}}},
		{"a forged cursor under a real MAC", "a", url.Values{"nextToken": {forged + "." + mac}}},
		{"a desc token for an asc list", "a", url.Values{"nextToken": {tok}, "order": {"asc"}}},
		{"garbage", "a", url.Values{"nextToken": {"%%%"}}},
		{"limit 0", "a", url.Values{"limit": {"0"}}},
		{"limit 101", "a", url.Values{"limit": {"101"}}},
		{"order sideways", "a", url.Values{"order": {"sideways"}}},
	} {
		if _, err := s.parsePage(tc.q, tc.team); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if _, err := s.parsePage(url.Values{"nextToken": {tok}}, "a"); err != nil {
		t.Errorf("own token refused: %v", err)
	}
	other := &Server{cfg: Config{TokenSecret: []byte(strings.Repeat("o", 32))}}
	if _, err := other.parsePage(url.Values{"nextToken": {tok}}, "a"); err == nil {
		t.Error("a token of a replica with another secret accepted")
	}
}

// getPage lists through the replica and returns the ids and X-Next-Token.
func getPage(t *testing.T, hs *httptest.Server, key, query string) (int, []string, string, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", hs.URL+"/v2/sandboxes?"+query, nil)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	_ = json.Unmarshal(b, &list)
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb.SandboxID)
	}
	return resp.StatusCode, ids, resp.Header.Get("X-Next-Token"), string(b)
}

func TestListPagesAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	c, hs := apiServer(t)
	ctx := t.Context()
	mk := func(ns, id string) {
		sb := &agentsv1.Sandbox{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: ns, Labels: map[string]string{kube.LabelSandboxID: id}}}
		sb.Spec.PodTemplate.Spec.Containers = []corev1.Container{{Name: "c", Image: "base"}}
		if err := c.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
		sb.Status.SandboxID = id
		if err := c.Status().Update(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	var mine []string
	for i := range 5 {
		id := fmt.Sprintf("ipagea%014d", i)
		mine = append(mine, id)
		mk("team-a", id)
	}
	mk("team-b", "ipageb00000000000000")
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, ids, _, body := getPage(t, hs, "e2b_keya", "")
		if len(ids) == len(mine) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("list: %s, want %d sandboxes", body, len(mine))
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, order := range []string{"desc", "asc"} {
		var got []string
		q := url.Values{"limit": {"2"}, "order": {order}}
		pages := 0
		for {
			st, ids, next, body := getPage(t, hs, "e2b_keya", q.Encode())
			if st != 200 {
				t.Fatalf("%s page %d: %d %s", order, pages, st, body)
			}
			pages++
			got = append(got, ids...)
			if next == "" {
				break
			}
			// Team B holding team A's token gets a 400, not team A's page.
			if st, ids, _, body := getPage(t, hs, "e2b_keyb", url.Values{"limit": {"2"}, "order": {order}, "nextToken": {next}}.Encode()); st != 400 || len(ids) != 0 {
				t.Errorf("team B with team A's token: %d %s", st, body)
			}
			q.Set("nextToken", next)
		}
		if pages != 3 {
			t.Errorf("%s: %d pages of at most 2 for 5 sandboxes", order, pages)
		}
		want := slices.Clone(got)
		slices.Sort(want)
		if !slices.Equal(want, mine) {
			t.Errorf("%s: paged %v, want each of %v once", order, got, mine)
		}
	}
	if st, ids, next, body := getPage(t, hs, "e2b_keyb", "limit=1"); st != 200 || len(ids) != 1 || ids[0] != "ipageb00000000000000" || next != "" {
		t.Errorf("team B: %d %v next %q %s", st, ids, next, body)
	}
}
