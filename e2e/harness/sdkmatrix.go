package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// SDKMatrixEnv names the file SDKMatrix appends its lines to; `make test`
// sets it and prints the file as one table once every package has run.
const SDKMatrixEnv = "AGENTBOX_SDK_MATRIX"

// SDKMatrix records whether t passed with the npm module installed as
// dir/node_modules/<module> (e.g. "e2b-250", an alias of e2b@2.50.0): when
// t ends it logs "SDK matrix: <name>@<version> <test> PASS|FAIL", the name
// and version read from the installed package.json, and appends
// "<name> <version> <test> PASS|FAIL" to the file $AGENTBOX_SDK_MATRIX
// names, if any. Call it after [NPMInstall].
func SDKMatrix(t testing.TB, dir, module string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "node_modules", module, "package.json"))
	var pkg struct{ Name, Version string }
	if err == nil {
		err = json.Unmarshal(b, &pkg)
	}
	if err != nil || pkg.Name == "" || pkg.Version == "" {
		t.Fatalf("SDK matrix: installed %s in %s: %v", module, dir, err)
	}
	t.Cleanup(func() {
		result := "PASS"
		if t.Failed() {
			result = "FAIL"
		}
		if t.Skipped() {
			result = "SKIP"
		}
		t.Logf("SDK matrix: %s@%s %s %s", pkg.Name, pkg.Version, t.Name(), result)
		path := os.Getenv(SDKMatrixEnv)
		if path == "" {
			return
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			t.Errorf("SDK matrix: %v", err)
			return
		}
		defer f.Close()
		if _, err := fmt.Fprintf(f, "%s %s %s %s\n", pkg.Name, pkg.Version, t.Name(), result); err != nil {
			t.Errorf("SDK matrix: %v", err)
		}
	})
}
