package template

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentbox/agentbox/internal/errdefs"
)

func TestLayeredDefinition(t *testing.T) {
	base := Definition{Name: "base", Packages: []string{"bash"}}
	otherBase := Definition{Name: "base", Packages: []string{"bash", "curl"}}
	id := func(d Definition) string {
		t.Helper()
		s, err := d.ID()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	on := func(b Definition) Definition { return Definition{Name: "app", Base: &b, Packages: []string{"socat"}} }
	// The base is part of the hash: a changed base is a new template.
	if id(on(base)) == id(on(otherBase)) {
		t.Error("layered definitions on different bases share an id")
	}
	if id(on(base)) == id(Definition{Name: "app", Packages: []string{"socat"}}) {
		t.Error("a layered definition hashes like a bootstrapped one")
	}
	for _, tc := range []struct {
		name string
		d    Definition
	}{
		{"invalid base", Definition{Name: "app", Base: &Definition{Name: "Bad"}}},
		{"other suite", Definition{Name: "app", Suite: "trixie", Base: &base}},
	} {
		if _, err := tc.d.ID(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", tc.name, err)
		}
	}
	// Builtins other than base sit on base and install only their extras.
	defs := BuiltinDefinitions()
	for _, name := range []string{"browser", "desktop"} {
		d := defs[name]
		if d.Base == nil || d.Base.Name != "base" {
			t.Errorf("builtin %s is not layered on base", name)
		}
		if id(*d.Base) != id(defs["base"]) {
			t.Errorf("builtin %s: its base differs from the builtin base", name)
		}
	}
}

func TestAptInstallScript(t *testing.T) {
	s := aptInstallScript([]string{"chromium", "socat"})
	for _, want := range []string{"set -e", "--no-install-recommends chromium socat", "rm -rf /var/lib/apt/lists/*"} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q: %s", want, s)
		}
	}
}
