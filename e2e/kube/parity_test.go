package kube

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentbox/agentbox/e2e/harness"
)

// parityStep is one request of the parity table. Paths and bodies name
// sandboxes by the placeholders of earlier steps ({A}: the caller's,
// {B}: another team's, {M}: an id nobody has; {W}: the caller's webhook,
// {MW}: a webhook id nobody has).
type parityStep struct {
	name, method, path, body string
	other                    bool   // sent with the other team's key
	noKey                    bool   // sent without a key
	save                     string // the answer's sandboxID (or saveField) becomes this placeholder
	saveField                string // the field save reads, if not sandboxID
	saveTeam                 bool   // the answer's teamID is the caller's team ({T})
	wait                     bool   // the answer may be a transition's: retry on 409 a while
	events                   bool   // the answer is events: retry while it is [] a while (they are derived after the fact)
}

// parityTable is what both server modes must answer alike: valid and
// invalid creates, list filters, every sandbox route on a missing and a
// foreign id, pause and resume, and snapshots.
func parityTable() []parityStep {
	manyMeta := map[string]string{}
	for i := range 65 {
		manyMeta[fmt.Sprintf("k%d", i)] = "v"
	}
	many, _ := json.Marshal(map[string]any{"templateID": "base", "metadata": manyMeta})
	return []parityStep{
		{name: "create", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":600,"metadata":{"suite":"parity"}}`, save: "A"},
		{name: "create (other team)", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":600}`, other: true, save: "B"},

		{name: "create v2 without templateID", method: "POST", path: "/v2/sandboxes", body: `{}`},
		{name: "create v1 without templateID", method: "POST", path: "/sandboxes", body: `{"timeout":30}`},
		{name: "create with a blank templateID", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"  "}`},
		{name: "create with an empty body", method: "POST", path: "/v2/sandboxes", body: ``},
		{name: "create: metadata key with a control character", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","metadata":{"a\u0001":"x"}}`},
		{name: "create: too much metadata", method: "POST", path: "/v2/sandboxes", body: string(many)},
		{name: "create: metadata of the wrong type", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","metadata":{"a":1}}`},
		{name: "create: env name starting with a digit", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","envVars":{"1X":"y"}}`},
		{name: "create: env value with a NUL", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","envVars":{"X":"a\u0000b"}}`},
		{name: "create: unknown isolation", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","isolation":"kvm"}`},
		{name: "create: empty isolation", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","isolation":""}`},
		{name: "create: negative timeout", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":-1}`},
		{name: "create: timeout over the maximum", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":999999}`},
		{name: "create: private traffic without secure (v1)", method: "POST", path: "/sandboxes", body: `{"templateID":"base","network":{"allowPublicTraffic":false}}`},
		{name: "create: denyOut not an address", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","network":{"denyOut":["not-an-address"]}}`},
		{name: "create: allowOut domain without deny-all", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","network":{"allowOut":["example.com"]}}`},
		{name: "create: httpsPorts names envd", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","network":{"httpsPorts":[49983]}}`},
		{name: "create: egress proxy without a port", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","network":{"egressProxy":{"address":"no-port"}}}`},
		{name: "create with a network policy", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":300,"network":{"denyOut":["0.0.0.0/0"],"allowOut":["1.1.1.1"],"allowPublicTraffic":false,"maskRequestHost":"app.example:8080"}}`, save: "N"},
		{name: "info with a network policy", method: "GET", path: "/sandboxes/{N}"},
		{name: "connect with a network policy", method: "POST", path: "/v2/sandboxes/{N}/connect", body: `{"timeout":300}`},
		{name: "kill with a network policy", method: "DELETE", path: "/sandboxes/{N}"},
		{name: "create without internet", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","timeout":300,"allow_internet_access":false}`, save: "I"},
		{name: "info without internet", method: "GET", path: "/sandboxes/{I}"},
		{name: "kill without internet", method: "DELETE", path: "/sandboxes/{I}"},
		{name: "create: autoPauseMemory alone", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","autoPauseMemory":false}`},
		{name: "create gvisor", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","isolation":"gvisor","timeout":300}`, save: "G"},
		{name: "info gvisor", method: "GET", path: "/sandboxes/{G}"},
		{name: "kill gvisor", method: "DELETE", path: "/sandboxes/{G}"},
		{name: "create microvm", method: "POST", path: "/v2/sandboxes", body: `{"templateID":"base","isolation":"microvm","timeout":300}`, save: "V"},
		{name: "info microvm", method: "GET", path: "/sandboxes/{V}"},
		{name: "kill microvm", method: "DELETE", path: "/sandboxes/{V}"},

		{name: "list v2 by metadata", method: "GET", path: "/v2/sandboxes?metadata=suite%3Dparity"},
		{name: "list v1 by metadata", method: "GET", path: "/sandboxes?metadata=suite%3Dparity"},
		{name: "list v2 paused", method: "GET", path: "/v2/sandboxes?metadata=suite%3Dparity&state=paused"},
		{name: "list v2 page of one", method: "GET", path: "/v2/sandboxes?metadata=suite%3Dparity&limit=1&order=asc"},
		{name: "list: unknown state", method: "GET", path: "/v2/sandboxes?state=sleeping"},
		{name: "list: metadata not KEY=VALUE", method: "GET", path: "/v2/sandboxes?metadata=nope"},
		{name: "list: limit 0", method: "GET", path: "/v2/sandboxes?limit=0"},
		{name: "list: bad order", method: "GET", path: "/v2/sandboxes?order=sideways"},
		{name: "list: forged nextToken", method: "GET", path: "/v2/sandboxes?nextToken=forged"},

		{name: "info", method: "GET", path: "/sandboxes/{A}"},
		{name: "info missing", method: "GET", path: "/sandboxes/{M}"},
		{name: "info foreign", method: "GET", path: "/sandboxes/{B}"},
		{name: "timeout", method: "POST", path: "/sandboxes/{A}/timeout", body: `{"timeout":500}`},
		{name: "timeout without a body", method: "POST", path: "/sandboxes/{A}/timeout"},
		{name: "timeout missing", method: "POST", path: "/sandboxes/{M}/timeout", body: `{"timeout":60}`},
		{name: "timeout foreign", method: "POST", path: "/sandboxes/{B}/timeout", body: `{"timeout":60}`},
		{name: "refresh", method: "POST", path: "/sandboxes/{A}/refreshes", body: `{"duration":30}`},
		{name: "refresh foreign", method: "POST", path: "/sandboxes/{B}/refreshes"},
		{name: "connect v1 without timeout", method: "POST", path: "/sandboxes/{A}/connect", body: `{}`},
		{name: "connect running", method: "POST", path: "/v2/sandboxes/{A}/connect", body: `{"timeout":600}`},
		{name: "connect missing", method: "POST", path: "/v2/sandboxes/{M}/connect", body: `{"timeout":60}`},
		{name: "connect foreign", method: "POST", path: "/v2/sandboxes/{B}/connect", body: `{"timeout":60}`},
		{name: "resume running", method: "POST", path: "/sandboxes/{A}/resume", body: `{}`},
		{name: "resume missing", method: "POST", path: "/sandboxes/{M}/resume", body: `{}`},
		{name: "pause missing", method: "POST", path: "/sandboxes/{M}/pause"},
		{name: "pause foreign", method: "POST", path: "/sandboxes/{B}/pause"},

		{name: "snapshot", method: "POST", path: "/sandboxes/{A}/snapshots", body: `{"name":"parity"}`},
		{name: "snapshot with a bad name", method: "POST", path: "/sandboxes/{A}/snapshots", body: `{"name":"Bad Name"}`},
		{name: "snapshot missing", method: "POST", path: "/sandboxes/{M}/snapshots", body: `{}`},
		{name: "snapshot foreign", method: "POST", path: "/sandboxes/{B}/snapshots", body: `{}`},
		{name: "list snapshots of the sandbox", method: "GET", path: "/snapshots?sandboxID={A}"},
		{name: "list snapshots by name", method: "GET", path: "/snapshots?name=parity"},
		{name: "list snapshots: limit 0", method: "GET", path: "/snapshots?limit=0"},
		{name: "list snapshots (other team)", method: "GET", path: "/snapshots?name=parity", other: true},
		{name: "delete snapshot (other team)", method: "DELETE", path: "/templates/parity:default", other: true},
		{name: "delete snapshot", method: "DELETE", path: "/templates/parity:default"},
		{name: "list snapshots after the delete", method: "GET", path: "/snapshots?name=parity"},

		{name: "pause", method: "POST", path: "/sandboxes/{A}/pause"},
		{name: "pause again", method: "POST", path: "/sandboxes/{A}/pause"},
		{name: "info paused", method: "GET", path: "/sandboxes/{A}"},
		{name: "list v2 paused again", method: "GET", path: "/v2/sandboxes?metadata=suite%3Dparity&state=paused"},
		{name: "connect paused resumes", method: "POST", path: "/v2/sandboxes/{A}/connect", body: `{"timeout":600}`},
		{name: "info resumed", method: "GET", path: "/sandboxes/{A}", wait: true},

		{name: "kill missing", method: "DELETE", path: "/sandboxes/{M}"},
		{name: "kill foreign", method: "DELETE", path: "/sandboxes/{B}"},
		{name: "kill", method: "DELETE", path: "/sandboxes/{A}"},
		{name: "info killed", method: "GET", path: "/sandboxes/{A}"},
		{name: "kill (other team)", method: "DELETE", path: "/sandboxes/{B}", other: true},
		{name: "no key", method: "GET", path: "/v2/sandboxes", noKey: true},

		// Lifecycle events (GET /events/sandboxes), after the sandbox's life.
		{name: "events: created", method: "GET", path: "/events/sandboxes/{A}?types=sandbox.lifecycle.created", events: true},
		{name: "events: paused, oldest first", method: "GET", path: "/events/sandboxes/{A}?types=sandbox.lifecycle.paused&orderAsc=true", events: true},
		{name: "events: killed", method: "GET", path: "/events/sandboxes/{A}?types=sandbox.lifecycle.killed", events: true},
		{name: "events: the team's newest killed", method: "GET", path: "/events/sandboxes?types=sandbox.lifecycle.killed&limit=1", events: true},
		{name: "events: types comma-separated", method: "GET", path: "/events/sandboxes/{A}?types=sandbox.lifecycle.created,sandbox.lifecycle.killed&orderAsc=true", events: true},
		{name: "events: past the end", method: "GET", path: "/events/sandboxes/{A}?offset=1000&limit=1"},
		{name: "events: missing sandbox", method: "GET", path: "/events/sandboxes/{M}"},
		{name: "events: foreign sandbox", method: "GET", path: "/events/sandboxes/{B}"},
		{name: "events: limit 0", method: "GET", path: "/events/sandboxes/{A}?limit=0"},
		{name: "events: limit over 100", method: "GET", path: "/events/sandboxes?limit=101"},
		{name: "events: negative offset", method: "GET", path: "/events/sandboxes?offset=-1"},
		{name: "events: orderAsc not a boolean", method: "GET", path: "/events/sandboxes?orderAsc=sideways"},
		{name: "events: unknown type", method: "GET", path: "/events/sandboxes?types=sandbox.lifecycle.exploded"},
		{name: "events: no key", method: "GET", path: "/events/sandboxes", noKey: true},

		// Webhooks (/events/webhooks). The address is never resolved here
		// (checked again at delivery), and the webhook hears only snapshots,
		// of which there are no more: nothing is owed to it.
		{name: "webhook create", method: "POST", path: "/events/webhooks", body: `{"name":"parity","url":"https://hooks.example.com/parity","events":["sandbox.lifecycle.checkpointed","sandbox.lifecycle.checkpointed"],"signatureSecret":"parity-secret-1"}`,
			save: "W", saveField: "id", saveTeam: true},
		{name: "webhook create: no url", method: "POST", path: "/events/webhooks", body: `{"events":["sandbox.lifecycle.killed"],"signatureSecret":"parity-secret-1"}`},
		{name: "webhook create: no events", method: "POST", path: "/events/webhooks", body: `{"url":"https://hooks.example.com/p","signatureSecret":"parity-secret-1"}`},
		{name: "webhook create: unknown event", method: "POST", path: "/events/webhooks", body: `{"url":"https://hooks.example.com/p","events":["sandbox.lifecycle.exploded"],"signatureSecret":"parity-secret-1"}`},
		{name: "webhook create: short secret", method: "POST", path: "/events/webhooks", body: `{"url":"https://hooks.example.com/p","events":["sandbox.lifecycle.killed"],"signatureSecret":"short"}`},
		{name: "webhook create: unknown field", method: "POST", path: "/events/webhooks", body: `{"url":"https://hooks.example.com/p","events":["sandbox.lifecycle.killed"],"signatureSecret":"parity-secret-1","secret":"x"}`},
		{name: "webhook create: not http", method: "POST", path: "/events/webhooks", body: `{"url":"ftp://hooks.example.com/p","events":["sandbox.lifecycle.killed"],"signatureSecret":"parity-secret-1"}`},
		{name: "webhook create: loopback address", method: "POST", path: "/events/webhooks", body: `{"url":"http://127.0.0.1:9/hook","events":["sandbox.lifecycle.killed"],"signatureSecret":"parity-secret-1"}`},
		{name: "webhook create: metadata address", method: "POST", path: "/events/webhooks", body: `{"url":"http://169.254.169.254/latest","events":["sandbox.lifecycle.killed"],"signatureSecret":"parity-secret-1"}`},
		{name: "webhook create: not JSON", method: "POST", path: "/events/webhooks", body: `nope`},
		{name: "webhook list", method: "GET", path: "/events/webhooks"},
		{name: "webhook get", method: "GET", path: "/events/webhooks/{W}"},
		{name: "webhook get missing", method: "GET", path: "/events/webhooks/{MW}"},
		{name: "webhook get (other team)", method: "GET", path: "/events/webhooks/{W}", other: true},
		{name: "webhook list (other team)", method: "GET", path: "/events/webhooks", other: true},
		{name: "webhook patch", method: "PATCH", path: "/events/webhooks/{W}", body: `{"name":"renamed","enabled":false}`},
		{name: "webhook patch: no events", method: "PATCH", path: "/events/webhooks/{W}", body: `{"events":[]}`},
		{name: "webhook patch: loopback address", method: "PATCH", path: "/events/webhooks/{W}", body: `{"url":"http://localhost:9/x"}`},
		{name: "webhook patch (other team)", method: "PATCH", path: "/events/webhooks/{W}", body: `{"name":"stolen"}`, other: true},
		{name: "webhook patch missing", method: "PATCH", path: "/events/webhooks/{MW}", body: `{"name":"x"}`},
		{name: "webhook get after the patch", method: "GET", path: "/events/webhooks/{W}"},
		{name: "webhook delete (other team)", method: "DELETE", path: "/events/webhooks/{W}", other: true},
		{name: "webhook delete missing", method: "DELETE", path: "/events/webhooks/{MW}"},
		{name: "webhook delete", method: "DELETE", path: "/events/webhooks/{W}"},
		{name: "webhook get after the delete", method: "GET", path: "/events/webhooks/{W}"},
		{name: "webhook list after the delete", method: "GET", path: "/events/webhooks"},
		{name: "webhook: no key", method: "GET", path: "/events/webhooks", noKey: true},
	}
}

// parityTarget is one server mode: its URL and two teams' keys.
type parityTarget struct {
	url, key, otherKey string
}

// parityAnswer is one normalised answer.
type parityAnswer struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
}

var (
	parityTime  = regexp.MustCompile(`"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"`)
	parityToken = regexp.MustCompile(`"(envdAccessToken|trafficAccessToken)":"[^"]*"`)
	// An event's own id and execution id are fresh UUIDs, and how long
	// the sandbox ran differs by a few milliseconds.
	parityEventID  = regexp.MustCompile(`"(id|sandboxExecutionId)":"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"`)
	parityExecTime = regexp.MustCompile(`"execution_time":\d+`)
)

// runParity sends the table to target and returns the answers with ids,
// times and tokens replaced by placeholders.
func runParity(ctx context.Context, t *testing.T, target parityTarget) []parityAnswer {
	t.Helper()
	ids := map[string]string{"M": "imissingsandbox00000", "MW": "00000000-0000-4000-8000-000000000000"}
	team := ""
	sub := func(s string) string {
		for k, v := range ids {
			s = strings.ReplaceAll(s, "{"+k+"}", v)
		}
		return s
	}
	var out []parityAnswer
	table := parityTable()
	for _, st := range table {
		key := target.key
		if st.other {
			key = target.otherKey
		}
		if st.noKey {
			key = ""
		}
		var status int
		var body []byte
		for deadline := time.Now().Add(time.Minute); ; {
			status, body = parityDo(ctx, t, target.url, key, st.method, sub(st.path), sub(st.body))
			retry := (st.wait && status == http.StatusConflict) || (st.events && status == http.StatusOK && string(body) == "[]")
			if !retry || time.Now().After(deadline) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		var got map[string]any
		_ = json.Unmarshal(body, &got)
		if st.save != "" {
			field := cmp.Or(st.saveField, "sandboxID")
			id, _ := got[field].(string)
			ids[st.save] = id
			if id == "" {
				ids[st.save] = "inosandbox" + st.save
			}
		}
		if st.saveTeam {
			team, _ = got["teamID"].(string)
		}
		out = append(out, parityAnswer{Status: status, Body: string(body)})
	}
	// Normalised once every placeholder is known (the team is learnt late).
	var teamField *regexp.Regexp
	if team != "" {
		teamField = regexp.MustCompile(`"(teamID|sandboxTeamId)":"` + regexp.QuoteMeta(team) + `"`)
	}
	for i := range out {
		norm := out[i].Body
		for k, v := range ids {
			if v != "" {
				norm = strings.ReplaceAll(norm, v, "{"+k+"}")
			}
		}
		if teamField != nil {
			norm = teamField.ReplaceAllString(norm, `"$1":"{T}"`)
		}
		norm = parityTime.ReplaceAllString(norm, `"<time>"`)
		norm = parityToken.ReplaceAllString(norm, `"$1":"<token>"`)
		if table[i].events {
			norm = parityEventID.ReplaceAllString(norm, `"$1":"<uuid>"`)
			norm = parityExecTime.ReplaceAllString(norm, `"execution_time":"<ms>"`)
		}
		out[i].Body = norm
	}
	return out
}

func parityDo(ctx context.Context, t *testing.T, base, key, method, path, body string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if json.Valid(b) {
		var v any
		_ = json.Unmarshal(b, &v)
		b, _ = json.Marshal(v) // canonical: sorted keys
	}
	return resp.StatusCode, bytes.TrimSpace(b)
}

// TestAPIParity drives the same table of requests through a node agent's
// own API (the local backend) and through `serve --kubernetes` in front of
// it (the Kubernetes backend), and checks they answer alike: the same
// status and the same body, once ids, times and tokens are set aside.
func TestAPIParity(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, kcPath, secret := teamCluster(ctx, t)
	agent := harness.Start(t, harness.Args("--kube-controller", "--kubeconfig", kcPath,
		"--kube-node", "node-a", "--kube-lease-namespace", "agentbox-system", "--token-secret-file", secret))
	t.Cleanup(func() { drainTeamNamespaces(t, c, "team-a", "team-b") })
	rep := startReplica(t, agent.Bin, kcPath, secret)

	local := runParity(ctx, t, parityTarget{url: agent.URL, key: agent.APIKey, otherKey: agent.NewKey(t, "parity-other")})
	cluster := runParity(ctx, t, parityTarget{url: rep.URL, key: mintKubeKey(t, agent.Bin, kcPath, "team-a"), otherKey: mintKubeKey(t, agent.Bin, kcPath, "team-b")})
	for i, st := range parityTable() {
		l, k := local[i], cluster[i]
		t.Logf("%s: %d %s", st.name, l.Status, l.Body)
		if st.save != "" && l.Status != http.StatusCreated {
			t.Errorf("%s: %d %s, want 201: the steps after it test nothing", st.name, l.Status, l.Body)
		}
		if l != k {
			t.Errorf("%s (%s %s):\n  local:      %d %s\n  kubernetes: %d %s", st.name, st.method, st.path, l.Status, l.Body, k.Status, k.Body)
		}
	}
}
