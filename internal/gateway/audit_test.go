package gateway

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"testing"
)

func frame(flags byte, msg []byte) []byte {
	out := []byte{flags, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	return append(out, msg...)
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

func TestEnvelope(t *testing.T) {
	tests := []struct {
		name     string
		data     []byte
		ok       bool
		msg      string
		restLen  int
		wantFlag byte
	}{
		{"plain", frame(0, []byte("abc")), true, "abc", 0, 0},
		{"compressed", frame(1, gz([]byte("hello"))), true, "hello", 0, 1},
		{"end of stream with rest", append(frame(2, []byte("{}")), 9, 9), true, "{}", 2, 2},
		{"short header", []byte{0, 0, 0}, false, "", 3, 0},
		{"incomplete body", frame(0, []byte("abcdef"))[:8], false, "", 8, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			flags, msg, rest, ok := envelope(tt.data)
			if ok != tt.ok || string(msg) != tt.msg || len(rest) != tt.restLen || flags != tt.wantFlag {
				t.Fatalf("got flags %d msg %q rest %d ok %v", flags, msg, len(rest), ok)
			}
		})
	}
}
