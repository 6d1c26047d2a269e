package sandbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// maxMethods is the most methods any type of the package may have, the
// Manager included: lower it as concerns move out, never raise it.
const maxMethods = 40

// TestMethodCount keeps every type of the package small: a type that grows
// past the ceiling should give a concern a type of its own.
func TestMethodCount(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse package: %v", err)
	}
	counts := map[string]int{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				fn, ok := d.(*ast.FuncDecl)
				if !ok || fn.Recv == nil || len(fn.Recv.List) == 0 {
					continue
				}
				counts[recvName(fn.Recv.List[0].Type)]++
			}
		}
	}
	if counts["Manager"] == 0 {
		t.Fatal("found no Manager methods: is the parser looking at the package?")
	}
	for name, n := range counts {
		if n > maxMethods {
			t.Errorf("type %s has %d methods, over the ceiling of %d: move a concern into a type of its own with a narrow interface", name, n, maxMethods)
		}
	}
}

func recvName(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
