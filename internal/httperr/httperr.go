// Package httperr answers errors of the errdefs vocabulary over HTTP in
// E2B's {code, message} shape, the same way on every HTTP surface of the
// server (the local API and the cluster's API tier).
package httperr

import (
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// Status maps the error vocabulary to HTTP statuses, in one place.
func Status(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrUnauthenticated):
		return http.StatusUnauthorized
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return http.StatusTooManyRequests
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, errdefs.ErrNoSpace):
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// Message strips the trailing ": <sentinel>" so users read the cause only.
func Message(err error) string {
	msg := err.Error()
	for _, s := range []error{errdefs.ErrInvalidArgument, errdefs.ErrUnauthenticated, errdefs.ErrNotFound, errdefs.ErrConflict,
		errdefs.ErrTooLarge, errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrNoSpace} {
		msg = strings.TrimSuffix(msg, ": "+s.Error())
	}
	return msg
}

// WriteJSON answers status with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Write answers err with its status and message.
func Write(w http.ResponseWriter, err error) {
	status := Status(err)
	if (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) && w.Header().Get("Retry-After") == "" {
		// Back-pressure: nothing was changed, and a retry may pass.
		w.Header().Set("Retry-After", "1")
	}
	msg := Message(err)
	if status >= 500 {
		msg = redactHostPaths(msg)
	}
	WriteJSON(w, status, rest.Error{Code: status, Message: msg})
}

// hostPath matches an absolute path of two or more components.
var hostPath = regexp.MustCompile(`/[^\s/:'"()\[\]]+(?:/[^\s/:'"()\[\]]*)+`)

// redactHostPaths hides absolute paths in a server-side failure: they name
// the host's data dir, bundles and runtime logs (a CRIU dump log, say),
// which are no business of an API client and map the host for an attacker.
// Client errors (4xx) keep theirs: they name what the client sent. The
// server logs its failures whole.
func redactHostPaths(msg string) string {
	return hostPath.ReplaceAllString(msg, "<server path>")
}
