package kubeapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/gateway"
	"github.com/agentbox/agentbox/internal/httperr"
	"github.com/agentbox/agentbox/internal/kube"
	agentsv1 "github.com/agentbox/agentbox/internal/kube/apis/agents/v1beta1"
	"github.com/agentbox/agentbox/internal/sandbox"
)

type agentKey struct{}

// routedID returns the sandbox a data-plane request is for ("" = an API
// request), or a client error, as the agents' gateway reads it.
func routedID(r *http.Request) (id string, errMsg string) {
	id, _, routed, errMsg := gateway.Route(r)
	if !routed {
		id = ""
	}
	return id, errMsg
}

// dataPlane sends sandbox traffic to the node agent running the sandbox,
// whose own gateway checks the access and traffic tokens and reaches the
// sandbox; everything else goes to api.
func (s *Server) dataPlane(next http.Handler) http.Handler {
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			addr := pr.In.Context().Value(agentKey{}).(string)
			pr.SetURL(&url.URL{Scheme: "http", Host: addr})
			pr.Out.Host = pr.In.Host // the agent routes by it (or by the headers, kept)
			pr.SetXForwarded()
		},
		// Streams are flushed on every write whatever this says.
		FlushInterval: 20 * time.Millisecond,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			s.log.Debug("data plane proxy error", "err", err)
			httperr.WriteJSON(w, http.StatusBadGateway, map[string]any{"code": http.StatusBadGateway, "message": "the sandbox's node agent does not answer: " + err.Error()})
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, bad := routedID(r)
		if bad != "" {
			httperr.WriteJSON(w, http.StatusBadRequest, map[string]any{"code": http.StatusBadRequest, "message": bad})
			return
		}
		if id == "" && r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
			if !s.guesses.Guard(w, r, "signed URL", func() error {
				if id = s.signedBy(r); id == "" {
					return fmt.Errorf("invalid signature: no running sandbox issued this URL (it may have been killed): %w", errdefs.ErrUnauthenticated)
				}
				return nil
			}, func(w http.ResponseWriter, err error) {
				httperr.WriteJSON(w, http.StatusUnauthorized, map[string]any{"code": http.StatusUnauthorized, "message": httperr.Message(err)})
			}) {
				return
			}
		}
		if id == "" {
			gateway.APIHeaders(w.Header())
			next.ServeHTTP(w, r)
			return
		}
		addr, err := s.agentOf(r.Context(), id)
		if err != nil {
			if errors.Is(err, errNoSandbox) {
				httperr.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": http.StatusBadGateway})
				return
			}
			httperr.WriteJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "code": http.StatusBadGateway, "message": err.Error()})
			return
		}
		// Full duplex: the sandbox often answers before the request body
		// is all forwarded (as in the local gateway).
		_ = http.NewResponseController(w).EnableFullDuplex()
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), agentKey{}, addr)))
	})
}

var errNoSandbox = errors.New("no such sandbox")

// agentOf is the address of the node agent running sandbox id.
func (s *Server) agentOf(ctx context.Context, id string) (string, error) {
	sb, ok, err := s.byID(ctx, id)
	if err != nil {
		return "", err
	}
	if !ok || !sb.DeletionTimestamp.IsZero() || sb.Status.NodeName == "" {
		return "", errNoSandbox
	}
	var l coordv1.Lease
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.cfg.LeaseNamespace, Name: kube.LeasePrefix + sb.Status.NodeName}, &l); err != nil {
		return "", fmt.Errorf("node %s of sandbox %s has no agent Lease %s/%s%s: %w", sb.Status.NodeName, id, s.cfg.LeaseNamespace, kube.LeasePrefix, sb.Status.NodeName, err)
	}
	var st kube.NodeStatus
	if err := json.Unmarshal([]byte(l.Annotations[kube.AnnotationNodeStatus]), &st); err != nil || st.Address == "" {
		return "", fmt.Errorf("the agent of node %s reports no address on its Lease; run it with --kube-advertise-address", sb.Status.NodeName)
	}
	return st.Address, nil
}

// signedBy finds the sandbox whose access token signed a /files URL (the
// agent's gateway and envd check it again).
func (s *Server) signedBy(r *http.Request) string {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost || r.Method == http.MethodPut {
		op = "write"
	}
	sig := q.Get("signature")
	var list agentsv1.SandboxList
	if err := s.c.List(r.Context(), &list, client.HasLabels{kube.LabelSandboxID}); err != nil {
		return ""
	}
	for _, sb := range list.Items {
		id := sb.Labels[kube.LabelSandboxID]
		want := gateway.Signature(q.Get("path"), op, q.Get("username"), sandbox.AccessToken(s.cfg.TokenSecret, id), q.Get("signature_expiration"))
		if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1 {
			return id
		}
	}
	return ""
}
