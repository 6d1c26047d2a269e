package envd

import (
	"bufio"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/klauspost/compress/gzip"
)

// Signature computes the /files URL signature E2B's SDKs send:
// "v1_" + unpadded std base64 of sha256("<path>:<op>:<user>:<token>[:<exp>]").
// op is "read" or "write"; expiration 0 means none.
func Signature(path, op, username, token string, expiration int64) string {
	s := path + ":" + op + ":" + username + ":" + token
	if expiration != 0 {
		s += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// checkFilesAuth accepts the access-token header or a valid, unexpired
// signature of the request's query; without a token everything passes.
func (s *Server) checkFilesAuth(r *http.Request, op string, now time.Time) (int, string) {
	tok := s.currentToken()
	if tok == "" {
		return 0, ""
	}
	if h := r.Header.Get("X-Access-Token"); h != "" {
		if tokenEqual(h, tok) {
			return 0, ""
		}
		return http.StatusUnauthorized, unauthorizedMessage
	}
	q := r.URL.Query()
	sig := q.Get("signature")
	if sig == "" {
		return http.StatusUnauthorized, unauthorizedMessage
	}
	var exp int64
	if e := q.Get("signature_expiration"); e != "" {
		n, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			return http.StatusUnauthorized, "invalid signature expiration"
		}
		exp = n
	}
	if !tokenEqual(sig, Signature(q.Get("path"), op, q.Get("username"), tok, exp)) {
		return http.StatusUnauthorized, "invalid signature"
	}
	if exp != 0 && now.Unix() > exp {
		return http.StatusUnauthorized, "signature is already expired"
	}
	return 0, ""
}

// filesUser authorizes a /files request and selects its user.
func (s *Server) filesUser(w http.ResponseWriter, r *http.Request, op string) (*User, bool) {
	if code, msg := s.checkFilesAuth(r, op, time.Now()); code != 0 {
		writeJSONError(w, code, msg)
		return nil, false
	}
	u, err := s.userFromHeader(r.Header, r.URL.Query().Get("username"))
	if err != nil {
		writeJSONError(w, http.StatusUnauthorized, err.Error())
		return nil, false
	}
	return u, true
}

func (s *Server) handleDownload(w http.ResponseWriter, r *http.Request) {
	u, ok := s.filesUser(w, r, "read")
	if !ok {
		return
	}
	path, err := ResolvePath(r.URL.Query().Get("path"), u.Home)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	var f *os.File
	err = asUser(u, func() (err error) {
		f, err = os.Open(path)
		return err
	})
	if err != nil {
		writeFileError(w, path, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeFileError(w, path, err)
		return
	}
	if fi.IsDir() {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", path))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": filepath.Base(path)}))
	w.Header().Add("Vary", "Accept-Encoding")
	// Ranges address the plain bytes, so gzip only whole-file responses.
	if r.Header.Get("Range") == "" && acceptsGzip(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Encoding", "gzip")
		// Fastest level of klauspost's deflate: downloads are often large
		// and already compressed; it stores incompressible blocks at
		// ~2 GB/s where the standard library's BestSpeed manages ~300 MB/s
		// on this class of machine (and default-level gzip ~30 MB/s).
		// Large chunks on the wire: each write of a response without a
		// length is a chunk the gateway flushes on its own.
		bw := bufio.NewWriterSize(w, 256<<10)
		gz, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
		if r.Method != http.MethodHead {
			_, _ = io.CopyBuffer(gz, f, make([]byte, 256<<10))
		}
		if gz.Close() == nil {
			_ = bw.Flush()
		}
		return
	}
	http.ServeContent(w, r, filepath.Base(path), fi.ModTime(), f)
}

func acceptsGzip(h string) bool {
	for _, part := range strings.Split(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.TrimSpace(name) == "gzip" && !strings.Contains(strings.ReplaceAll(params, " ", ""), "q=0") {
			return true
		}
	}
	return false
}

// writeFileError maps an os error about path to E2B's JSON error.
func writeFileError(w http.ResponseWriter, path string, err error) {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("path '%s' does not exist", path))
	case errors.Is(err, fs.ErrPermission):
		writeJSONError(w, http.StatusForbidden, fmt.Sprintf("permission denied for '%s'", path))
	case isNoSpace(err):
		writeJSONError(w, http.StatusInsufficientStorage, fmt.Sprintf("not enough disk space for '%s'", path))
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, errdefs.ErrInvalidArgument):
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("invalid path '%s': %v", path, err))
	default:
		writeJSONError(w, http.StatusInternalServerError, fmt.Sprintf("'%s': %v", path, err))
	}
}

func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// uploadedFile is one element of the POST /files response.
type uploadedFile struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// uploadError carries the HTTP status of a failed upload.
type uploadError struct {
	code int
	msg  string
}

func (e *uploadError) Error() string { return e.msg }

func (s *Server) handleUpload(w http.ResponseWriter, r *http.Request) {
	u, ok := s.filesUser(w, r, "write")
	if !ok {
		return
	}
	md, err := metadataFromHeader(r.Header)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	var out []uploadedFile
	err = forEachUpload(r, func(target string, body io.Reader) error {
		path, err := ResolvePath(target, u.Home)
		if err != nil {
			return &uploadError{http.StatusBadRequest, err.Error()}
		}
		err = ensureParents(path, u)
		if err == nil {
			err = asUser(u, func() error { return writeInPlace(path, body, md) })
		}
		if err != nil {
			var ue *uploadError
			if errors.As(err, &ue) {
				return err
			}
			return fileErrorAsUpload(path, err)
		}
		out = append(out, uploadedFile{Path: path, Name: filepath.Base(path), Type: "file", Metadata: md})
		return nil
	})
	if err != nil {
		var ue *uploadError
		if errors.As(err, &ue) {
			writeJSONError(w, ue.code, ue.msg)
			return
		}
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func fileErrorAsUpload(path string, err error) error {
	rec := &recordingWriter{header: http.Header{}}
	writeFileError(rec, path, err)
	if errors.Is(err, fs.ErrPermission) {
		// Say which side failed: the target or one of its parents.
		return &uploadError{rec.code, fmt.Sprintf("cannot write '%s': permission denied", path)}
	}
	return &uploadError{rec.code, fmt.Sprintf("cannot write '%s': %s", path, strings.TrimPrefix(unwrapMsg(err), ""))}
}

func unwrapMsg(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// recordingWriter captures only the status code writeFileError picks.
type recordingWriter struct {
	header http.Header
	code   int
}

func (r *recordingWriter) Header() http.Header         { return r.header }
func (r *recordingWriter) Write(b []byte) (int, error) { return len(b), nil }
func (r *recordingWriter) WriteHeader(code int)        { r.code = code }

// forEachUpload calls fn for each file of an upload request, streaming:
// multipart parts one by one (field "file"; the part's filename is the
// target when the path query is absent) or a raw octet-stream body
// (optionally gzip-encoded) for the path query.
func forEachUpload(r *http.Request, fn func(target string, body io.Reader) error) error {
	queryPath := r.URL.Query().Get("path")
	ct, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		return &uploadError{http.StatusBadRequest, fmt.Sprintf("invalid Content-Type: %v", err)}
	}
	switch ct {
	case "multipart/form-data":
		if params["boundary"] == "" {
			return &uploadError{http.StatusBadRequest, "multipart body without boundary"}
		}
		mr := multipart.NewReader(r.Body, params["boundary"])
		n := 0
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				return &uploadError{http.StatusBadRequest, fmt.Sprintf("read multipart body: %v", err)}
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			target := queryPath
			if target == "" {
				target = partFileName(part)
			}
			if target == "" {
				part.Close()
				return &uploadError{http.StatusBadRequest, "file part without a filename and no path query"}
			}
			err = fn(target, part)
			part.Close()
			if err != nil {
				return err
			}
			n++
		}
		if n == 0 {
			return &uploadError{http.StatusBadRequest, "multipart body has no \"file\" part"}
		}
		return nil
	case "application/octet-stream":
		if queryPath == "" {
			return &uploadError{http.StatusBadRequest, "octet-stream upload needs the path query"}
		}
		var body io.Reader = r.Body
		switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
		case "", "identity":
		case "gzip":
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				return &uploadError{http.StatusBadRequest, fmt.Sprintf("invalid gzip body: %v", err)}
			}
			defer gz.Close()
			body = gz
		default:
			return &uploadError{http.StatusUnsupportedMediaType, fmt.Sprintf("unsupported Content-Encoding %q", enc)}
		}
		return fn(queryPath, body)
	default:
		return &uploadError{http.StatusUnsupportedMediaType, fmt.Sprintf("unsupported Content-Type %q", ct)}
	}
}

// partFileName is the part's filename as sent. multipart.Part.FileName
// strips directories, but E2B clients put the whole target path there.
func partFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// metadataFromHeader collects X-Metadata-<key> headers (first value wins,
// keys lower-cased).
func metadataFromHeader(h http.Header) (map[string]string, error) {
	var md map[string]string
	for name, vals := range h {
		key, ok := strings.CutPrefix(strings.ToLower(name), "x-metadata-")
		if !ok || len(vals) == 0 {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vals[0]
	}
	if err := validateMetadata(md); err != nil {
		return nil, err
	}
	return md, nil
}

// ensureParents makes the missing directories above path, as root, and
// gives each one it makes to u (as E2B's envd does), so a user's write may
// land below a directory only root could have made.
func ensureParents(path string, u *User) error {
	dir := filepath.Dir(path)
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if u != nil && u.UID != 0 {
			if err := os.Lchown(d, int(u.UID), int(u.GID)); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeInPlace writes body to path in place (open, O_TRUNC, stream), as E2B's
// envd does: a watcher sees the file's own name created and written, never
// a temporary one; a symlink's target is written; a hard-linked file keeps
// its links, and an existing file its mode and owner. It runs as the target
// user, so permissions are the user's and new files are the user's.
func writeInPlace(path string, body io.Reader, md map[string]string) error {
	fi, statErr := os.Stat(path)
	if statErr == nil && fi.IsDir() {
		return &uploadError{http.StatusBadRequest, fmt.Sprintf("path '%s' is a directory", path)}
	} else if statErr == nil && !fi.Mode().IsRegular() {
		return &uploadError{http.StatusBadRequest, fmt.Sprintf("path '%s' is not a regular file (%s)", path, fi.Mode().Type())}
	}
	// O_NONBLOCK: a FIFO without a reader fails at once instead of
	// blocking the handler; it is refused below anyway.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if errors.Is(statErr, fs.ErrNotExist) {
		if err := announceNewFile(f); err != nil {
			return err
		}
	}
	if fi, err := f.Stat(); err != nil {
		return err
	} else if !fi.Mode().IsRegular() {
		return &uploadError{http.StatusBadRequest, fmt.Sprintf("path '%s' is not a regular file (%s)", path, fi.Mode().Type())}
	}
	if _, err := io.Copy(f, body); err != nil {
		discardPartial(path, f, errors.Is(statErr, fs.ErrNotExist))
		var pe *fs.PathError
		if errors.As(err, &pe) || isNoSpace(err) {
			return err
		}
		return &uploadError{http.StatusBadRequest, fmt.Sprintf("read upload for '%s': %v", path, err)}
	}
	if err := replaceMetadata(f, md); err != nil {
		return err
	}
	return f.Close()
}
