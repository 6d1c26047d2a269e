package objstore

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func seal(t *testing.T, key []byte, b Binding, pt []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, key, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(pt); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// frames splits a sealed object into its header and chunk frames.
func frames(t *testing.T, sealed []byte) (hdr []byte, chunks [][]byte) {
	t.Helper()
	h := len(magic) + saltSize
	hdr, rest := sealed[:h], sealed[h:]
	for len(rest) > 0 {
		n := 5 + int(uint32(rest[1])<<24|uint32(rest[2])<<16|uint32(rest[3])<<8|uint32(rest[4]))
		chunks = append(chunks, rest[:n])
		rest = rest[n:]
	}
	return hdr, chunks
}

func join(hdr []byte, chunks ...[]byte) []byte {
	out := append([]byte{}, hdr...)
	for _, c := range chunks {
		out = append(out, c...)
	}
	return out
}

func TestSealedFraming(t *testing.T) {
	key, other := make([]byte, KeySize), make([]byte, KeySize)
	_, _ = rand.Read(key)
	_, _ = rand.Read(other)
	b := Binding{Object: "agents/sb1/1/image.tar", Team: "agents", Sandbox: "uid-1"}
	pt := make([]byte, 2*ChunkSize+1234)
	_, _ = rand.Read(pt)
	sealed := seal(t, key, b, pt)
	hdr, chunks := frames(t, sealed)
	if len(chunks) != 3 {
		t.Fatalf("%d chunks, want 3", len(chunks))
	}
	if bytes.Contains(sealed, pt[:64]) {
		t.Fatal("plaintext visible in the sealed object")
	}
	// The same plaintext sealed as another object, of the same sandbox.
	_, otherChunks := frames(t, seal(t, key, Binding{Object: "agents/sb1/1/manifest", Team: b.Team, Sandbox: b.Sandbox}, pt))
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)/2] ^= 1

	for _, tc := range []struct {
		name   string
		data   []byte
		key    []byte
		b      Binding
		wantOK bool
	}{
		{"intact", sealed, key, b, true},
		{"empty plaintext", seal(t, key, b, nil), key, b, true},
		{"exactly one chunk", seal(t, key, b, pt[:ChunkSize]), key, b, true},
		{"flipped byte", flipped, key, b, false},
		{"truncated mid-chunk", sealed[:len(sealed)-100], key, b, false},
		{"final chunk dropped", join(hdr, chunks[0], chunks[1]), key, b, false},
		{"header only", hdr, key, b, false},
		{"chunks reordered", join(hdr, chunks[1], chunks[0], chunks[2]), key, b, false},
		{"chunk repeated", join(hdr, chunks[0], chunks[0], chunks[1], chunks[2]), key, b, false},
		{"chunk swapped from another object", join(hdr, otherChunks[0], chunks[1], chunks[2]), key, b, false},
		{"trailing bytes", append(bytes.Clone(sealed), 0), key, b, false},
		{"wrong key", sealed, other, b, false},
		{"another object name", sealed, key, Binding{Object: "agents/sb1/1/other", Team: b.Team, Sandbox: b.Sandbox}, false},
		{"another team", sealed, key, Binding{Object: b.Object, Team: "team-b", Sandbox: b.Sandbox}, false},
		{"another sandbox", sealed, key, Binding{Object: b.Object, Team: b.Team, Sandbox: "uid-2"}, false},
		{"not sealed", []byte("plain text, not sealed by agentbox at all, long enough"), key, b, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := io.ReadAll(NewReader(bytes.NewReader(tc.data), tc.key, tc.b))
			if tc.wantOK {
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				if tc.name == "intact" && !bytes.Equal(got, pt) {
					t.Fatal("plaintext differs after the round trip")
				}
				return
			}
			if !errors.Is(err, ErrIntegrity) {
				t.Fatalf("open: err = %v, want ErrIntegrity", err)
			}
			// Nothing past the last authenticated chunk is ever returned.
			if !bytes.HasPrefix(pt, got) && len(got) > 0 {
				t.Fatalf("returned %d bytes that are not the plaintext's prefix", len(got))
			}
		})
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	raw := bytes.Repeat([]byte{7}, KeySize)
	for _, tc := range []struct {
		name string
		path string
		ok   bool
	}{
		{"raw 0600", write("raw", raw, 0o600), true},
		{"hex 0400", write("hex", []byte("0707070707070707070707070707070707070707070707070707070707070707\n"), 0o400), true},
		{"group readable", write("wide", raw, 0o640), false},
		{"too short", write("short", []byte("abc"), 0o600), false},
		{"missing", filepath.Join(dir, "nope"), false},
		{"a directory", dir, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := LoadKey(tc.path)
			if (err == nil) != tc.ok {
				t.Fatalf("LoadKey: err = %v, want ok %v", err, tc.ok)
			}
			if tc.ok && !bytes.Equal(k, raw) {
				t.Fatalf("key = %x", k)
			}
		})
	}
}
