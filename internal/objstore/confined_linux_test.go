package objstore

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/agentbox/agentbox/internal/untar"
)

// The test binary is the store's Self: it runs `__hook image-unpack`.
func TestMain(m *testing.M) {
	if len(os.Args) >= 4 && os.Args[1] == "__hook" && os.Args[2] == UnpackHook {
		if err := RunUnpackHook(os.Args[3:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(126)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// unpackers are the two ways an image is unpacked: in this process, and
// in the confined child the server uses.
func unpackers(t *testing.T) map[string]func(raw []byte, dir string, lim untar.Limits) error {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return map[string]func([]byte, string, untar.Limits) error{
		"in-process": func(raw []byte, dir string, lim untar.Limits) error {
			return Unpack(context.Background(), bytes.NewReader(raw), dir, lim)
		},
		"confined": func(raw []byte, dir string, lim untar.Limits) error {
			return unpackConfined(context.Background(), self, bytes.NewReader(raw), dir, lim)
		},
	}
}
