package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

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
