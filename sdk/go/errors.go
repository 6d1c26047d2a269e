package agentbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/agentbox/agentbox/api/gen/rest"
)

// Sentinel errors; every error of this package that means one of them
// matches it with errors.Is.
var (
	ErrNotFound     = errors.New("not found")    // HTTP 404, Connect not_found
	ErrUnauthorized = errors.New("unauthorized") // HTTP 401, Connect unauthenticated
	ErrInvalid      = errors.New("invalid")      // HTTP 400, Connect invalid_argument
	ErrConflict     = errors.New("conflict")     // HTTP 409, Connect already_exists
	ErrUnavailable  = errors.New("unavailable")  // HTTP 502/503: the sandbox is gone or paused
	ErrRateLimited  = errors.New("rate limited") // HTTP 429, Connect resource_exhausted
	ErrTimeout      = errors.New("timed out")    // Connect deadline_exceeded
)

// APIError is an error answer of the server: its HTTP status and message.
type APIError struct {
	Status  int    // HTTP status
	Message string // the server's message
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("%d %s", e.Status, http.StatusText(e.Status))
	}
	return fmt.Sprintf("%d: %s", e.Status, e.Message)
}

// Is maps the status to the package's sentinels.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Status == http.StatusNotFound
	case ErrUnauthorized:
		return e.Status == http.StatusUnauthorized || e.Status == http.StatusForbidden
	case ErrInvalid:
		return e.Status == http.StatusBadRequest
	case ErrConflict:
		return e.Status == http.StatusConflict
	case ErrUnavailable:
		return e.Status == http.StatusBadGateway || e.Status == http.StatusServiceUnavailable
	case ErrRateLimited:
		return e.Status == http.StatusTooManyRequests
	}
	return false
}

// decodeAPIError reads {"code":int,"message":string} (or plain text) from a
// failed response.
func decodeAPIError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &APIError{Status: resp.StatusCode}
	var body rest.Error
	if json.Unmarshal(b, &body) == nil && body.Message != "" {
		e.Message = body.Message
	} else {
		e.Message = strings.TrimSpace(string(b))
	}
	return e
}

// rpcError gives a Connect error the matching sentinel, keeping the
// *connect.Error reachable with errors.As.
func rpcError(op string, err error) error {
	if err == nil {
		return nil
	}
	var sentinel error
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		sentinel = ErrNotFound
	case connect.CodeUnauthenticated, connect.CodePermissionDenied:
		sentinel = ErrUnauthorized
	case connect.CodeInvalidArgument:
		sentinel = ErrInvalid
	case connect.CodeAlreadyExists:
		sentinel = ErrConflict
	case connect.CodeUnavailable:
		sentinel = ErrUnavailable
	case connect.CodeResourceExhausted:
		sentinel = ErrRateLimited
	case connect.CodeDeadlineExceeded:
		sentinel = ErrTimeout
	}
	return fmt.Errorf("%s: %w", op, &rpcErr{sentinel: sentinel, err: err})
}

// rpcErr shows only the server's message but matches both the sentinel and
// the underlying *connect.Error.
type rpcErr struct {
	sentinel error
	err      error
}

func (e *rpcErr) Error() string {
	var ce *connect.Error
	if errors.As(e.err, &ce) && ce.Message() != "" {
		return ce.Message()
	}
	return e.err.Error()
}

func (e *rpcErr) Unwrap() []error {
	if e.sentinel == nil {
		return []error{e.err}
	}
	return []error{e.sentinel, e.err}
}
