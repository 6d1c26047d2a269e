package interpreter

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/evanw/esbuild/pkg/api"
)

// Cells of JavaScript and TypeScript contexts are prepared here before they
// reach the Node kernel, which evaluates them with node:repl:
//   - TypeScript loses its types (esbuild; no type checking, like tsx or
//     Node's own type stripping);
//   - import statements, which a REPL cannot evaluate, become dynamic
//     imports with var bindings, so an import made in one cell is usable in
//     the next and re-running a cell does not fail on redeclaration;
//   - "export" in front of a declaration is dropped.
// Plain JavaScript without import/export is passed through untouched, so
// node:repl's own semantics (e.g. a lone {a: 1} is an object) apply.

var (
	hasModuleSyntax = regexp.MustCompile(`(?m)^\s*(import\s*[\w*{'"]|export\s)`)
	importFrom      = regexp.MustCompile(`(?m)^import\s+([\s\S]*?)\s+from\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*;?[ \t]*$`)
	importBare      = regexp.MustCompile(`(?m)^import\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')\s*;?[ \t]*$`)
	exportDecl      = regexp.MustCompile(`(?m)^export\s+(default\s+)?((?:async\s+)?function|class|const|let|var)\b`)
	exportDefault   = regexp.MustCompile(`(?m)^export\s+default\s+`)
	exportList      = regexp.MustCompile(`(?m)^export\s*\{[^}]*\}\s*(from\s*("[^"]*"|'[^']*'))?\s*;?[ \t]*$`)
	identifier      = regexp.MustCompile(`^[\p{L}_$][\p{L}\p{N}_$]*$`)
)

// prepareJS returns the code to hand to the Node kernel, or a SyntaxError
// message with line and column.
func prepareJS(code string, typescript bool) (string, error) {
	if !typescript && !hasModuleSyntax.MatchString(code) {
		return code, nil
	}
	loader := api.LoaderJS
	if typescript {
		loader = api.LoaderTS
	}
	res := api.Transform(code, api.TransformOptions{
		Loader: loader,
		Target: api.ESNext,
		// Keep every import: an import unused in this cell may be used by
		// the next one, which TypeScript's elision cannot know.
		TsconfigRaw:   `{"compilerOptions":{"verbatimModuleSyntax":true}}`,
		LegalComments: api.LegalCommentsNone,
		Sourcefile:    "cell",
	})
	if len(res.Errors) > 0 {
		e := res.Errors[0]
		if e.Location != nil {
			return "", fmt.Errorf("%s (%d:%d)", e.Text, e.Location.Line, e.Location.Column+1)
		}
		return "", fmt.Errorf("%s", e.Text)
	}
	return rewriteModuleSyntax(string(res.Code))
}

// rewriteModuleSyntax turns the import and export statements esbuild
// printed (one statement per line) into REPL-friendly code.
func rewriteModuleSyntax(code string) (string, error) {
	var firstErr error
	n := 0
	code = importFrom.ReplaceAllStringFunc(code, func(stmt string) string {
		m := importFrom.FindStringSubmatch(stmt)
		out, err := importBinding(m[1], m[2], n)
		n++
		if err != nil && firstErr == nil {
			firstErr = err
		}
		return out
	})
	if firstErr != nil {
		return "", firstErr
	}
	code = importBare.ReplaceAllString(code, "await import($1);")
	code = exportList.ReplaceAllString(code, "")
	code = exportDecl.ReplaceAllString(code, "$2")
	code = exportDefault.ReplaceAllString(code, "")
	return code, nil
}

// importBinding rewrites the clause of `import <clause> from <spec>`:
// `x`, `* as x`, `{ a, b as c }`, or a default followed by one of the others.
func importBinding(clause, spec string, n int) (string, error) {
	tmp := fmt.Sprintf("__abImport%d", n)
	var binds []string
	clause = strings.TrimSpace(clause)
	if def, rest, ok := strings.Cut(clause, ","); ok && !strings.HasPrefix(clause, "{") {
		binds = append(binds, strings.TrimSpace(def)+" = "+tmp+".default")
		clause = strings.TrimSpace(rest)
	}
	switch {
	case strings.HasPrefix(clause, "*"):
		name := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(strings.TrimPrefix(clause, "*")), "as"))
		if !identifier.MatchString(name) {
			return "", fmt.Errorf("SyntaxError: cannot read import clause %q", clause)
		}
		binds = append(binds, name+" = "+tmp)
	case strings.HasPrefix(clause, "{"):
		inner := strings.TrimSuffix(strings.TrimPrefix(clause, "{"), "}")
		var props []string
		for _, item := range strings.Split(inner, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			from, to, renamed := strings.Cut(item, " as ")
			from, to = strings.TrimSpace(from), strings.TrimSpace(to)
			if !renamed {
				to = from
			}
			if !identifier.MatchString(to) {
				return "", fmt.Errorf("SyntaxError: cannot read import clause %q", clause)
			}
			if from == to {
				props = append(props, to)
			} else {
				props = append(props, from+": "+to)
			}
		}
		if len(props) > 0 {
			binds = append(binds, "{ "+strings.Join(props, ", ")+" } = "+tmp)
		}
	case clause != "":
		if !identifier.MatchString(clause) {
			return "", fmt.Errorf("SyntaxError: cannot read import clause %q", clause)
		}
		binds = append(binds, clause+" = "+tmp+".default")
	}
	out := "var " + tmp + " = await import(" + spec + ");"
	if len(binds) > 0 {
		out += " var " + strings.Join(binds, ", ") + ";"
	}
	return out, nil
}
