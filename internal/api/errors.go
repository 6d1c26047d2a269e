package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"

	"github.com/agentbox/agentbox/api/gen/rest"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// statusOf maps the error vocabulary to HTTP statuses, in one place.
func statusOf(err error) int {
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

// message strips the trailing ": <sentinel>" so users read the cause only.
func message(err error) string {
	msg := err.Error()
	for _, s := range []error{errdefs.ErrInvalidArgument, errdefs.ErrUnauthenticated, errdefs.ErrNotFound, errdefs.ErrConflict,
		errdefs.ErrTooLarge, errdefs.ErrResourceExhausted, errdefs.ErrUnavailable, errdefs.ErrNoSpace} {
		msg = strings.TrimSuffix(msg, ": "+s.Error())
	}
	return msg
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	status := statusOf(err)
	if (status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable) && w.Header().Get("Retry-After") == "" {
		// Back-pressure: nothing was changed, and a retry may pass.
		w.Header().Set("Retry-After", "1")
	}
	msg := message(err)
	if status >= 500 {
		msg = redactHostPaths(msg)
	}
	writeJSON(w, status, rest.Error{Code: status, Message: msg})
}

// hostPath matches an absolute path of two or more components.
var hostPath = regexp.MustCompile(`/[^\s/:'"()\[\]]+(?:/[^\s/:'"()\[\]]*)+`)

// redactHostPaths hides absolute paths in a server-side failure: they name
// the host's data dir, bundles and runtime logs (a CRIU dump log, say),
// which are no business of an API client and map the host for an attacker.
// Client errors (4xx) keep theirs: they name what the client sent. The
// manager logs its failures (create, pause, resume) whole.
func redactHostPaths(msg string) string {
	return hostPath.ReplaceAllString(msg, "<server path>")
}

// decodeBody reads a JSON body of at most limit bytes into v. An empty body
// is allowed when optional is true. Errors name the offending field.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, optional bool, v any) error {
	body := http.MaxBytesReader(w, r.Body, limit)
	data, err := io.ReadAll(body)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fmt.Errorf("request body is over the limit of %d bytes: %w", limit, errdefs.ErrTooLarge)
		}
		return fmt.Errorf("read request body: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if len(strings.TrimSpace(string(data))) == 0 || strings.TrimSpace(string(data)) == "null" {
		if optional {
			return nil
		}
		return fmt.Errorf("request body is empty; send a JSON object: %w", errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(data, v); err != nil {
		var typeErr *json.UnmarshalTypeError
		var syntaxErr *json.SyntaxError
		switch {
		case errors.As(err, &typeErr) && typeErr.Field != "":
			return fmt.Errorf("%s: expected %s, got JSON %s: %w", typeErr.Field, typeErr.Type, typeErr.Value, errdefs.ErrInvalidArgument)
		case errors.As(err, &syntaxErr):
			return fmt.Errorf("request body is not valid JSON at byte %d: %v: %w", syntaxErr.Offset, err, errdefs.ErrInvalidArgument)
		default:
			return fmt.Errorf("request body: %v: %w", err, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}
