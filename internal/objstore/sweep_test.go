package objstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"slices"
	"testing"

	"github.com/minio/minio-go/v7"
)

func TestSweepImages(t *testing.T) {
	ours := Binding{Team: "agents", Sandbox: "uid-1"}
	other := Binding{Team: "agents", Sandbox: "uid-2"}
	// put is one object of the layout, sealed for b.
	type put struct {
		name string
		b    Binding
	}
	image := func(prefix string, b Binding) []put {
		return []put{{prefix + imageObject, b}, {prefix + manifestObject, b}}
	}
	tests := []struct {
		name     string
		objects  []put
		keep     string
		wantGone []string
	}{
		{"every generation goes on a delete",
			append(image("agents/sb1/2/", ours), image("agents/sb1/3/", ours)...), "",
			[]string{"agents/sb1/2/", "agents/sb1/3/"}},
		{"the recorded generation is kept",
			append(image("agents/sb1/2/", ours), image("agents/sb1/3/", ours)...), "agents/sb1/3/",
			[]string{"agents/sb1/2/"}},
		{"an upload cut short before its manifest goes",
			[]put{{"agents/sb1/4/" + imageObject, ours}}, "",
			[]string{"agents/sb1/4/"}},
		{"another Sandbox's image under the same id stays",
			image("agents/sb1/5/", other), "", nil},
		{"a snapshot named like the sandbox id stays",
			[]put{{"agents/sb1/snapshot/" + manifestObject, ours}, {"agents/sb1/x7/" + manifestObject, ours}}, "", nil},
		{"another sandbox id with the same start stays",
			image("agents/sb10/1/", ours), "", nil},
		{"another team's prefix stays",
			image("team-b/sb1/1/", ours), "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			url, raw := fakeS3(t)
			key := make([]byte, KeySize)
			_, _ = rand.Read(key)
			s, err := Open(ctx, Config{URL: url, AccessKey: "id", SecretKey: "secret", Key: key})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range tt.objects {
				if err := s.Put(ctx, o.name, o.b, bytes.NewReader([]byte("contents of "+o.name))); err != nil {
					t.Fatal(err)
				}
			}
			gone, err := s.SweepImages(ctx, "agents", "sb1", ours, tt.keep)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(gone)
			if !slices.Equal(gone, tt.wantGone) {
				t.Errorf("deleted %v, want %v", gone, tt.wantGone)
			}
			var left []string
			for o := range raw.ListObjects(ctx, "bkt", minio.ListObjectsOptions{Prefix: "images/", Recursive: true}) {
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				left = append(left, o.Key)
			}
			for _, o := range tt.objects {
				deleted := slices.ContainsFunc(tt.wantGone, func(p string) bool { return len(o.name) > len(p) && o.name[:len(p)] == p })
				if kept := slices.Contains(left, "images/"+o.name); kept == deleted {
					t.Errorf("%s: in the bucket %v, want %v (left: %v)", o.name, kept, !deleted, left)
				}
			}
		})
	}
}

func TestDeleteOwned(t *testing.T) {
	ours := Binding{Team: "agents", Sandbox: "uid-1"}
	other := Binding{Team: "agents", Sandbox: "uid-2"}
	const prefix = "agents/snap/snapshot/"
	tests := []struct {
		name     string
		objects  map[string]Binding
		wantGone bool
	}{
		{"a complete image sealed for it goes",
			map[string]Binding{prefix + imageObject: ours, prefix + manifestObject: ours}, true},
		{"an upload cut short before its manifest goes",
			map[string]Binding{prefix + imageObject: ours}, true},
		{"another object's image under the same prefix stays",
			map[string]Binding{prefix + imageObject: other, prefix + manifestObject: other}, false},
		{"nothing stored is no error", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			url, raw := fakeS3(t)
			key := make([]byte, KeySize)
			_, _ = rand.Read(key)
			s, err := Open(ctx, Config{URL: url, AccessKey: "id", SecretKey: "secret", Key: key})
			if err != nil {
				t.Fatal(err)
			}
			for name, b := range tt.objects {
				if err := s.Put(ctx, name, b, bytes.NewReader([]byte("contents of "+name))); err != nil {
					t.Fatal(err)
				}
			}
			gone, err := s.DeleteOwned(ctx, prefix, ours)
			if err != nil || gone != tt.wantGone {
				t.Fatalf("DeleteOwned = %v, %v; want %v, nil", gone, err, tt.wantGone)
			}
			n := 0
			for o := range raw.ListObjects(ctx, "bkt", minio.ListObjectsOptions{Prefix: "images/", Recursive: true}) {
				if o.Err != nil {
					t.Fatal(o.Err)
				}
				n++
			}
			if want := len(tt.objects); tt.wantGone && n != 0 || !tt.wantGone && n != want {
				t.Errorf("%d objects left of %d (deleted: %v)", n, want, gone)
			}
		})
	}
}
