// Package apireq reads what E2B clients send the same way on every API
// surface of the server (the local API and the cluster's API tier): the API
// key, JSON bodies, the filters of a sandbox list and the pages of a
// snapshot list.
package apireq

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// Key is the API key of r: the X-API-Key header, else a Bearer token
// ("" when there is neither).
func Key(r *http.Request) string {
	if key := r.Header.Get("X-API-Key"); key != "" {
		return key
	}
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if key == r.Header.Get("Authorization") {
		return "" // not a Bearer token
	}
	return key
}

// ListFilters are the metadata and state filters of a sandbox list.
type ListFilters struct {
	Metadata map[string]string // nil: any
	States   []string          // "running", "paused"; none: any
}

// ParseListFilters reads the metadata and state (repeated or
// comma-separated) parameters of q. The last value of a metadata key wins.
func ParseListFilters(q url.Values) (ListFilters, error) {
	var f ListFilters
	if raw := q.Get("metadata"); raw != "" {
		md, err := parseMetadataFilter(raw)
		if err != nil {
			return f, err
		}
		f.Metadata = md
	}
	for _, st := range q["state"] {
		for part := range strings.SplitSeq(st, ",") {
			switch part {
			case "running", "paused":
				f.States = append(f.States, part)
			case "":
			default:
				return f, fmt.Errorf("state: %q is not a state; use running or paused: %w", Truncate(part), errdefs.ErrInvalidArgument)
			}
		}
	}
	return f, nil
}

// parseMetadataFilter decodes a metadata filter as the e2b SDKs encode it
// and E2B's API decodes it: the SDK URL-encodes each key and value, joins
// them into "k=v&k2=v2", URL-encodes that string, and sends it as a query
// parameter (which url.Values already decoded). So the string is decoded
// once, split into pairs on '&' and '=', and each key and value decoded
// again. A '&' or '=' inside a key or value arrives encoded and survives the
// split. A pair that is not exactly KEY=VALUE is refused, as E2B does.
func parseMetadataFilter(raw string) (map[string]string, error) {
	const how = "send KEY=VALUE pairs joined by '&', each key and value URL-encoded and the whole string URL-encoded again, as the e2b SDKs do"
	s, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, fmt.Errorf("metadata: %q is not URL-encoded (%v); %s: %w", Truncate(raw), err, how, errdefs.ErrInvalidArgument)
	}
	out := map[string]string{}
	for pair := range strings.SplitSeq(s, "&") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.Contains(v, "=") {
			return nil, fmt.Errorf("metadata: %q is not one KEY=VALUE pair; %s: %w", Truncate(pair), how, errdefs.ErrInvalidArgument)
		}
		key, err := url.QueryUnescape(k)
		if err != nil {
			return nil, fmt.Errorf("metadata: key %q is not URL-encoded (%v); %s: %w", Truncate(k), err, how, errdefs.ErrInvalidArgument)
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return nil, fmt.Errorf("metadata: value of %q is not URL-encoded (%v); %s: %w", Truncate(key), err, how, errdefs.ErrInvalidArgument)
		}
		out[key] = val
	}
	return out, nil
}

// Truncate shortens a client's value quoted back in an error.
func Truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// DecodeJSON reads a JSON body of at most limit bytes into v. An empty body
// is allowed when optional is true. Errors name the offending field.
func DecodeJSON(w http.ResponseWriter, r *http.Request, limit int64, optional bool, v any) error {
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

// SnapshotLimit reads the limit of a GET /snapshots page: 1 to 100, 100
// when absent.
func SnapshotLimit(q url.Values) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return 100, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 100 {
		return 0, fmt.Errorf("limit: must be an integer from 1 to 100, got %q: %w", Truncate(v), errdefs.ErrInvalidArgument)
	}
	return n, nil
}

// Page is the page of items (in a stable order) that follows the item
// whose key is after ("" for the first page), at most limit long; next is
// the key to send as nextToken for the page after it ("" when none).
func Page[T any](items []T, key func(T) string, after string, limit int) (page []T, next string) {
	start := 0
	if after != "" {
		start = len(items)
		for i, it := range items {
			if key(it) == after {
				start = i + 1
			}
		}
	}
	end := min(start+limit, len(items))
	if end < len(items) {
		next = key(items[end-1])
	}
	return items[start:end], next
}
