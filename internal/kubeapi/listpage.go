package kubeapi

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/apireq"
)

// Pages of GET /v2/sandboxes, as the local API pages them: `limit` (1-100,
// default 100), `order` (desc by start, the default, or asc) and
// `nextToken`, the X-Next-Token header of the previous page (absent on the
// last). The replica reads from its informer cache, where the API server's
// continue tokens do not apply: sandboxes are in a stable order (start
// time, then id) and the token names the last one sent. The token is bound
// to the caller's team with an HMAC under a key derived from the token
// secret: it names a sandbox id, and a token issued to one team is refused
// (400) for any other, so it reveals nothing and reaches nothing across
// teams (the list itself only ever reads the caller's own namespaces).
const (
	defaultPageLimit = 100
	maxPageLimit     = 100
	// listTokenLabel separates the list token key from the secret's other
	// uses (envd access and traffic tokens).
	listTokenLabel = "agentbox list nextToken v1"
)

type pageQuery struct {
	limit int
	asc   bool
	after *listCursor
}

// listCursor is the last sandbox of a page.
type listCursor struct {
	startedAt int64 // unix nanoseconds
	id        string
	asc       bool
}

// cmp orders v after c (> 0), at it (0) or before it (< 0) in the order.
func (c listCursor) cmp(v view) int {
	n := v.started.UnixNano()
	byTime := compareInt(n, c.startedAt)
	byID := strings.Compare(c.id, v.id) // desc: ids ascending within one start time
	if c.asc {
		byTime, byID = -byTime, -byID
	}
	if byTime != 0 {
		return -byTime
	}
	return -byID
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sortViews puts views in the page order: newest first (ties by id), or
// the exact reverse with asc.
func sortViews(views []view, asc bool) {
	slices.SortFunc(views, func(a, b view) int {
		c := listCursor{startedAt: b.started.UnixNano(), id: b.id, asc: asc}
		return c.cmp(a)
	})
}

func (s *Server) listTokenKey() []byte {
	m := hmac.New(sha256.New, s.cfg.TokenSecret)
	m.Write([]byte(listTokenLabel))
	return m.Sum(nil)
}

func (s *Server) listTokenMAC(team, payload string) []byte {
	m := hmac.New(sha256.New, s.listTokenKey())
	m.Write([]byte(team))
	m.Write([]byte{0})
	m.Write([]byte(payload))
	return m.Sum(nil)[:16]
}

// encodeToken is the nextToken after v for team.
func (s *Server) encodeToken(team string, v view, asc bool) string {
	payload := strconv.FormatInt(v.started.UnixNano(), 10) + "__" + v.id
	if asc {
		payload += "__asc"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + base64.RawURLEncoding.EncodeToString(s.listTokenMAC(team, payload))
}

// parsePage reads limit, order and nextToken for team.
func (s *Server) parsePage(q url.Values, team string) (pageQuery, error) {
	pq := pageQuery{limit: defaultPageLimit}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageLimit {
			return pq, invalid("limit: must be an integer from 1 to %d, got %q", maxPageLimit, apireq.Truncate(v))
		}
		pq.limit = n
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		pq.asc = true
	default:
		return pq, invalid("order: must be asc or desc")
	}
	tok := q.Get("nextToken")
	if tok == "" {
		return pq, nil
	}
	bad := invalid("nextToken: not a token this API issued to your team; pass the X-Next-Token header of the previous page, with the same order")
	p64, m64, ok := strings.Cut(tok, ".")
	payload, err := base64.RawURLEncoding.DecodeString(p64)
	mac, merr := base64.RawURLEncoding.DecodeString(m64)
	if !ok || err != nil || merr != nil || !hmac.Equal(mac, s.listTokenMAC(team, string(payload))) {
		return pq, bad
	}
	parts := strings.Split(string(payload), "__")
	if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "asc") {
		return pq, bad
	}
	n, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil {
		return pq, bad
	}
	c := &listCursor{startedAt: n, id: parts[1], asc: len(parts) == 3}
	if c.asc != pq.asc {
		return pq, bad
	}
	pq.after = c
	return pq, nil
}

// page returns the page of views (sorted by sortViews) that pq asks for
// and sets X-Next-Token when more follow, and, as the local API does when
// running sandboxes were asked for, X-Total-Running (of every page).
func (s *Server) page(w http.ResponseWriter, team string, views []view, pq pageQuery, states []string) []view {
	if len(states) == 0 || slices.Contains(states, "running") {
		running := 0
		for _, v := range views {
			if v.state == "running" {
				running++
			}
		}
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	start := 0
	if pq.after != nil {
		start = len(views)
		for i, v := range views {
			if pq.after.cmp(v) > 0 {
				start = i
				break
			}
		}
	}
	rest := views[start:]
	if len(rest) > pq.limit {
		rest = rest[:pq.limit]
		w.Header().Set("X-Next-Token", s.encodeToken(team, rest[len(rest)-1], pq.asc))
	}
	return rest
}
