package interpreter

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// streamSink writes an execution as E2B's NDJSON stream: one object per
// line, flushed at once. Output beyond the byte cap is dropped after one
// truncation marker, so a flood costs neither this process nor the client
// more than the cap. When a write fails (the client is gone), gone is
// called, which interrupts the code.
type streamSink struct {
	mu        sync.Mutex
	w         http.ResponseWriter
	rc        *http.ResponseController
	gone      func()
	failed    bool
	lastWrite time.Time

	limit     int64
	written   int64
	truncated bool
	dropped   int64
	errSeen   bool
}

func newStreamSink(w http.ResponseWriter, limit int64, gone func()) *streamSink {
	return &streamSink{w: w, rc: http.NewResponseController(w), gone: gone, limit: limit, lastWrite: time.Now()}
}

func (s *streamSink) emit(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"type": "error", "name": "InterpreterError", "value": "unencodable output: " + err.Error()})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
		return
	}
	s.lastWrite = time.Now()
	if _, err := s.w.Write(append(b, '\n')); err == nil {
		err = s.rc.Flush()
		if err == nil {
			return
		}
	}
	s.failed = true
	s.gone()
}

// keepalive writes {"type":"keepalive"} after every period of silence,
// which also detects a vanished client; the returned func stops it.
func (s *streamSink) keepalive(period time.Duration) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(period / 5)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s.mu.Lock()
				idle := time.Since(s.lastWrite) >= period
				s.mu.Unlock()
				if idle {
					s.emit(map[string]any{"type": "keepalive"})
				}
			}
		}
	}()
	return func() { close(stop); <-done }
}

func (s *streamSink) ExecutionCount(n int) {
	s.emit(map[string]any{"type": "number_of_executions", "execution_count": n})
}

func (s *streamSink) Stdout(text string) { s.stream("stdout", text) }
func (s *streamSink) Stderr(text string) { s.stream("stderr", text) }

func (s *streamSink) stream(kind, text string) {
	if text == "" {
		return
	}
	s.mu.Lock()
	if s.truncated {
		s.dropped += int64(len(text))
		s.mu.Unlock()
		return
	}
	room := s.limit - s.written
	cut := int64(len(text)) > room
	if cut {
		n := int(room)
		for n > 0 && !utf8.RuneStart(text[n]) {
			n--
		}
		s.dropped += int64(len(text) - n)
		text = text[:n]
		s.truncated = true
	}
	s.written += int64(len(text))
	s.mu.Unlock()
	now := time.Now().UTC().Format(time.RFC3339Nano)
	if text != "" {
		s.emit(map[string]any{"type": kind, "text": text, "timestamp": now})
	}
	if cut {
		s.emit(map[string]any{"type": "stderr", "timestamp": now,
			"text": fmt.Sprintf("\n[output truncated: this execution printed more than %d bytes; the rest of its stdout and stderr is discarded]\n", s.limit)})
	}
}

// mimeFields maps MIME types to E2B result fields.
var mimeFields = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

func (s *streamSink) Result(bundle map[string]json.RawMessage, main bool) {
	out := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]json.RawMessage{}
	for mime, raw := range bundle {
		field, known := mimeFields[mime]
		if !known {
			extra[mime] = raw
			continue
		}
		switch field {
		case "json", "data", "chart":
			if string(raw) != "null" {
				out[field] = raw
			}
		default:
			text := mimeText(raw)
			switch field {
			case "text":
				// E2B strips the quotes of a string's repr: 'abc' → abc.
				if len(text) >= 2 && (text[0] == '\'' || text[0] == '"') && text[len(text)-1] == text[0] {
					text = text[1 : len(text)-1]
				}
			case "png", "jpeg", "pdf":
				text = strings.TrimSpace(text)
			}
			out[field] = text
		}
	}
	out["extra"] = extra
	s.emit(out)
}

// mimeText reads a MIME bundle value: a string, or a list of lines.
func mimeText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var lines []string
	if json.Unmarshal(raw, &lines) == nil {
		return strings.Join(lines, "")
	}
	return string(raw)
}

func (s *streamSink) Error(name, value, traceback string) {
	s.mu.Lock()
	s.errSeen = true
	s.mu.Unlock()
	s.emit(map[string]any{"type": "error", "name": name, "value": value, "traceback": traceback})
}

func (s *streamSink) sawError() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errSeen
}
