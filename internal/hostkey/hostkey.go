// Package hostkey names sandboxes on the host without naming them: a host
// path, mount point or process argument that every host user can read
// carries an opaque key, HMAC-SHA256(secret, sandbox id) as 32 hex digits,
// instead of the id. Without the secret (a root-only file) a host user can
// neither tell which sandbox a key belongs to nor compute the key of an id.
package hostkey

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// Keyer computes keys with one secret.
type Keyer struct{ secret []byte }

// Load reads the secret in the file at path, making it (0600) on first use.
// Concurrent first uses agree on one secret.
func Load(path string) (Keyer, error) {
	for range 100 {
		b, err := os.ReadFile(path)
		if err == nil && len(b) >= 32 {
			return Keyer{secret: b}, nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return Keyer{}, fmt.Errorf("host key secret: %w", err)
		}
		k, err := create(path)
		if !errors.Is(err, fs.ErrExist) {
			return k, err
		}
		// Another process is making it: read it once written.
		time.Sleep(10 * time.Millisecond)
	}
	return Keyer{}, fmt.Errorf("host key secret %s is shorter than 32 bytes; remove it (as root) if no server uses it", path)
}

// create makes a new secret at path, failing with fs.ErrExist if there is one.
func create(path string) (Keyer, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return Keyer{}, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return Keyer{}, err
		}
		return Keyer{}, fmt.Errorf("host key secret: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return Keyer{}, err
	}
	return Keyer{secret: b}, f.Close()
}

// Read reads an existing secret (for tools and tests that look a sandbox's
// host names up, as root).
func Read(path string) (Keyer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Keyer{}, err
	}
	return Keyer{secret: b}, nil
}

// Key is id's opaque host name: 32 hex digits.
func (k Keyer) Key(id string) string {
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte(id))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// IsKey reports whether name has the shape of a key.
func IsKey(name string) bool {
	if len(name) != 32 {
		return false
	}
	_, err := hex.DecodeString(name)
	return err == nil
}
