package template

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"unicode"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/agentbox/agentbox/internal/destpolicy"
	"github.com/agentbox/agentbox/internal/errdefs"
)

// maxRegistryErrorBody is what is read of a registry's error answer.
const maxRegistryErrorBody = 64 << 10

// registryGuard sits between the registry client and the destination
// policy's transport. It keeps another service's bytes out of the build
// log: an error answer that is not a registry error document, or a
// manifest answer that is not a manifest, is dropped and summed up (status,
// size) in the log instead.
type registryGuard struct {
	rt       http.RoundTripper
	progress io.Writer
}

// isManifestType reports whether t is a media type a registry answers a
// manifest GET with.
func isManifestType(t string) bool {
	switch t {
	case "application/vnd.oci.image.manifest.v1+json",
		"application/vnd.oci.image.index.v1+json",
		"application/vnd.docker.distribution.manifest.v2+json",
		"application/vnd.docker.distribution.manifest.list.v2+json",
		"application/vnd.docker.distribution.manifest.v1+json",
		"application/vnd.docker.distribution.manifest.v1+prettyjws",
		"application/json":
		return true
	}
	return false
}

// errNotRegistry is an answer that is not a registry's.
var errNotRegistry = errors.New("not a registry response")

func (g *registryGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	ctype, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	where := req.Method + " " + req.URL.Host + req.URL.Path
	switch {
	case resp.StatusCode >= 400:
		body, n, rerr := readSome(resp.Body, maxRegistryErrorBody)
		resp.Body.Close()
		if doc, ok := registryErrorDoc(ctype, body); ok && rerr == nil {
			resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(doc)), int64(len(doc))
			return resp, nil
		}
		if n > 0 {
			fmt.Fprintf(g.progress, "    registry answer to %s: %d, %s of %s that is not a registry error (not shown)\n", where, resp.StatusCode, byteCount(n), mediaTypeName(ctype))
		}
		resp.Body, resp.ContentLength = http.NoBody, 0
		resp.Header.Del("Content-Type")
		return resp, nil
	case resp.StatusCode/100 == 2 && req.Method == http.MethodGet && strings.Contains(req.URL.Path, "/manifests/"):
		if isManifestType(ctype) {
			return resp, nil
		}
		_, n, _ := readSome(resp.Body, maxRegistryErrorBody)
		resp.Body.Close()
		return nil, fmt.Errorf("%s answered %d with %s of %s, not an image manifest (not shown): %w", where, resp.StatusCode, byteCount(n), mediaTypeName(ctype), errNotRegistry)
	}
	return resp, nil
}

// readSome reads up to max bytes of r and counts (up to 16 times more) the
// rest.
func readSome(r io.Reader, max int64) ([]byte, int64, error) {
	b, err := io.ReadAll(io.LimitReader(r, max))
	n := int64(len(b))
	if err == nil && n == max {
		m, cerr := io.Copy(io.Discard, io.LimitReader(r, 16*max))
		n, err = n+m, cerr
	}
	return b, n, err
}

// registryError is the error document of the distribution spec.
type registryError struct {
	Errors []struct {
		Code    string `json:"code"`
		Message string `json:"message,omitempty"`
	} `json:"errors"`
}

// registryErrorDoc returns body re-encoded with only the codes and short,
// printable messages of a registry error document; ok is false for
// anything else.
func registryErrorDoc(ctype string, body []byte) ([]byte, bool) {
	if ctype != "application/json" {
		return nil, false
	}
	var e registryError
	if json.Unmarshal(body, &e) != nil || len(e.Errors) == 0 || len(e.Errors) > 16 {
		return nil, false
	}
	for i := range e.Errors {
		if !isRegistryCode(e.Errors[i].Code) {
			return nil, false
		}
		e.Errors[i].Message = printable(e.Errors[i].Message, 200)
	}
	out, err := json.Marshal(e)
	return out, err == nil
}

func isRegistryCode(c string) bool {
	if c == "" || len(c) > 40 {
		return false
	}
	for _, r := range c {
		if !(r >= 'A' && r <= 'Z' || r == '_') {
			return false
		}
	}
	return true
}

// printable keeps the first max printable characters of s.
func printable(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, s)
	if r := []rune(s); len(r) > max {
		return string(r[:max]) + "…"
	}
	return s
}

// mediaTypeName names a content type for the log if it looks like one.
func mediaTypeName(t string) string {
	if t == "" || len(t) > 80 || strings.IndexFunc(t, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || strings.ContainsRune("/.+-_", r))
	}) >= 0 {
		return "an unnamed type"
	}
	return t
}

func byteCount(n int64) string {
	if n == 1 {
		return "1 byte"
	}
	return fmt.Sprintf("%d bytes", n)
}

// pullError turns an error of a pull from registry into the build's
// message: a policy refusal says so; a registry's error answer becomes its
// status and error codes; anything else keeps a short printable text. It
// never carries a body a server sent.
func pullError(registry string, err error) error {
	if err == nil {
		return nil
	}
	if re, ok := errors.AsType[*destpolicy.RefusedError](err); ok {
		if re.Dest == registry || re.Dest == registry+":443" || re.Dest == registry+":80" {
			return fmt.Errorf("fromImage registry %w", re)
		}
		return fmt.Errorf("fromImage registry %s sent the pull elsewhere (a redirect or a token server): %w", registry, re)
	}
	if errors.Is(err, destpolicy.ErrTooManyRedirects) {
		return fmt.Errorf("fromImage registry %s: %w (%w)", registry, destpolicy.ErrTooManyRedirects, errdefs.ErrUnavailable)
	}
	if te, ok := errors.AsType[*transport.Error](err); ok {
		msg := fmt.Sprintf("%d %s", te.StatusCode, http.StatusText(te.StatusCode))
		if te.Request != nil {
			msg = te.Request.Method + " " + te.Request.URL.Path + ": " + msg
		}
		for i, d := range te.Errors {
			if i == 3 {
				break
			}
			msg += "; " + printable(string(d.Code)+": "+d.Message, 200)
		}
		return fmt.Errorf("registry %s answered %s (%w)", registry, msg, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("registry %s: %s (%w)", registry, printable(err.Error(), 300), errdefs.ErrUnavailable)
}
