package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/agentbox/agentbox/internal/errdefs"
	"github.com/agentbox/agentbox/internal/testutil"
)

const secretReply = "SECRET-of-another-service"

// TestRegistryAnswersNotEchoed: a server on an allowed address that is not
// a registry (an internal web app, a metadata service) never has its
// bytes copied into the build's error or log; a registry's own error
// document is kept.
func TestRegistryAnswersNotEchoed(t *testing.T) {
	testutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		want    string // in the error or log
	}{
		{"HTML error page", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, "<html>"+secretReply+"</html>")
		}, "not a registry error (not shown)"},
		{"JSON that is not a registry error", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"AccessKeyId":"`+secretReply+`"}`)
		}, "403"},
		{"manifest that is a web page", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, secretReply)
		}, "not an image manifest (not shown)"},
		{"registry error document", func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v2/" {
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, `{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":"`+secretReply+`"}]}`)
		}, "MANIFEST_UNKNOWN: manifest unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			host := strings.TrimPrefix(srv.URL, "http://")
			s := newTestStore(t)
			s.SetFetchPolicy(allowPolicy(t, host))
			var log bytes.Buffer
			_, err := s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "x", From: host + "/app:v1", FromImage: true}, &log)
			if err == nil {
				t.Fatal("built from a server that is not a registry")
			}
			all := err.Error() + "\n" + log.String()
			if strings.Contains(all, "SECRET") {
				t.Errorf("the server's reply reached the build:\n%s", all)
			}
			if !strings.Contains(all, tc.want) {
				t.Errorf("want %q in:\n%s", tc.want, all)
			}
		})
	}
}

// TestLayerDiffIDVerified: an image whose config names the diff ID of
// another layer (a popular base's) for its own content cannot plant that
// content in the shared layer store under the other layer's key.
func TestLayerDiffIDVerified(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	good := layerTar(t, []tarEntry{{name: "etc/", typ: tar.TypeDir}, {name: "etc/os", body: "genuine"}})
	bad := layerTar(t, []tarEntry{{name: "etc/", typ: tar.TypeDir}, {name: "etc/os", body: "planted"}})
	goodImg := imageOf(t, [][]byte{good}, v1.Config{})
	goodDiffs, err := goodImg.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	badImg := imageOf(t, [][]byte{bad}, v1.Config{})
	cf, err := badImg.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs = goodDiffs.RootFS.DiffIDs
	liar, err := mutate.ConfigFile(badImg, cf)
	if err != nil {
		t.Fatal(err)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	ref, _ := name.ParseReference(host + "/evil/base:v1")
	if err := remote.Write(ref, liar); err != nil {
		t.Fatal(err)
	}
	s := newTestStore(t)
	s.SetFetchPolicy(allowPolicy(t, host))
	_, err = s.BuildFromSpec(ctx, BuildSpec{TeamID: "b", Name: "x", From: ref.String(), FromImage: true}, nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "not to the diff ID") {
		t.Fatalf("got %v, want the layer refused", err)
	}
	if s.HasLayer(LayerKey("oci-diff", goodDiffs.RootFS.DiffIDs[0].String())) {
		t.Fatal("the planted content is stored under the genuine layer's diff ID")
	}
}
