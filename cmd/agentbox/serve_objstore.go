package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/agentbox/agentbox/internal/kube"
	"github.com/agentbox/agentbox/internal/objstore"
	"github.com/agentbox/agentbox/internal/sandbox"
)

// objectStoreFlags are where node agents keep suspended Sandboxes' images.
type objectStoreFlags struct {
	URL             string
	KeyFile         string
	CredentialsFile string
}

func addObjectStoreFlags(f *pflag.FlagSet, o *objectStoreFlags) {
	f.StringVar(&o.URL, "kube-object-store", "", "S3-compatible bucket, as http(s)://host[:port]/bucket[/prefix], where node agents store the memory image of every suspended Sandbox (sealed with --kube-object-store-key-file), so another agent resumes it when its node is lost; credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or --kube-object-store-credentials-file (docs/kubernetes.md)")
	f.StringVar(&o.KeyFile, "kube-object-store-key-file", "", "file (mode 0600) holding the 32-byte key (raw, or 64 hex digits) that seals stored images with AES-256-GCM; the same file on every agent (required with --kube-object-store)")
	f.StringVar(&o.CredentialsFile, "kube-object-store-credentials-file", "", "file (mode 0600) with AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=... lines for --kube-object-store (default: those environment variables)")
}

// openImages connects the object store when --kube-object-store is set.
func openImages(ctx context.Context, o objectStoreFlags, mgr *sandbox.Manager, c serveConfig) (*kube.Images, error) {
	if o.URL == "" {
		if o.KeyFile != "" || o.CredentialsFile != "" {
			return nil, errors.New("--kube-object-store-key-file and --kube-object-store-credentials-file need --kube-object-store")
		}
		return nil, nil
	}
	if o.KeyFile == "" {
		return nil, errors.New("--kube-object-store needs --kube-object-store-key-file: stored images hold tenant memory and are sealed with that key")
	}
	key, err := objstore.LoadKey(o.KeyFile)
	if err != nil {
		return nil, err
	}
	access, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	if o.CredentialsFile != "" {
		if access, secret, err = objstore.LoadCredentials(o.CredentialsFile); err != nil {
			return nil, err
		}
	}
	st, err := objstore.Open(ctx, objstore.Config{URL: o.URL, AccessKey: access, SecretKey: secret, Key: key})
	if err != nil {
		return nil, err
	}
	if st.Limits, err = c.Unpack.limits(); err != nil { // serve_unpack.go
		return nil, err
	}
	// Restored images are a sandbox's writing: they unpack in a confined
	// child of this binary.
	if st.Self, err = os.Executable(); err != nil {
		return nil, fmt.Errorf("--kube-object-store: own binary: %w", err)
	}
	// Exports hold tenant memory while they are uploaded.
	tmp := filepath.Join(c.DataDir, "kube-export")
	_ = os.RemoveAll(tmp) // exports a crash left behind
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("--kube-object-store: staging dir: %w", err)
	}
	if err := os.Chmod(tmp, 0o700); err != nil {
		return nil, fmt.Errorf("--kube-object-store: staging dir: %w", err)
	}
	return &kube.Images{Store: st, Mover: mgr.Snapshots(), TempDir: tmp}, nil
}
