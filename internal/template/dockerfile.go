package template

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// DockerfileError is a Dockerfile the builder cannot use, with its line.
type DockerfileError struct {
	Line int
	Msg  string
}

func (e *DockerfileError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("Dockerfile line %d: %s", e.Line, e.Msg)
	}
	return "Dockerfile: " + e.Msg
}

func (e *DockerfileError) Is(target error) bool { return target == errdefs.ErrInvalidArgument }

// ParseDockerfile translates a Dockerfile into a BuildSpec whose COPY/ADD
// steps read from contextDir (filtered by its .dockerignore). buildArgs
// override ARG defaults. Supported: FROM (template, image or snapshot; one
// stage), RUN, COPY, ADD (local files only), ENV, ARG, WORKDIR, USER,
// EXPOSE, CMD, ENTRYPOINT, HEALTHCHECK CMD (the ready check), LABEL and
// MAINTAINER (ignored). Anything else is an error naming its line.
func ParseDockerfile(r io.Reader, contextDir string, buildArgs map[string]string) (*BuildSpec, error) {
	res, err := parser.Parse(r)
	if err != nil {
		return nil, &DockerfileError{Msg: err.Error()}
	}
	var ignore *patternmatcher.PatternMatcher
	if contextDir != "" {
		if b, err := os.ReadFile(filepath.Join(contextDir, ".dockerignore")); err == nil {
			patterns, err := ignorefile.ReadAll(bytes.NewReader(b))
			if err != nil {
				return nil, &DockerfileError{Msg: ".dockerignore: " + err.Error()}
			}
			if ignore, err = patternmatcher.New(patterns); err != nil {
				return nil, &DockerfileError{Msg: ".dockerignore: " + err.Error()}
			}
		}
	}
	// As in Docker, steps run as root until a USER instruction, also on a
	// template whose sandboxes default to another user.
	spec := &BuildSpec{StepUser: "root"}
	lex := shell.NewLex(res.EscapeToken)
	args := map[string]string{} // declared ARGs in scope
	env := []string{}           // ENV so far, for expansion
	vars := func() shell.EnvGetter {
		all := []string{}
		for k, v := range args {
			all = append(all, k+"="+v)
		}
		return shell.EnvsFromSlice(append(all, env...))
	}
	expand := func(line int, w string) (string, error) {
		out, _, err := lex.ProcessWord(w, vars())
		if err != nil {
			return "", &DockerfileError{Line: line, Msg: err.Error()}
		}
		return out, nil
	}
	sawFrom := false
	for _, n := range res.AST.Children {
		line := n.StartLine
		instr := strings.ToUpper(n.Value)
		var words []string
		for w := n.Next; w != nil; w = w.Next {
			words = append(words, w.Value)
		}
		isJSON := n.Attributes["json"]
		flags, err := parseFlags(line, n.Flags)
		if err != nil {
			return nil, err
		}
		if len(n.Heredocs) > 0 {
			return nil, &DockerfileError{Line: line, Msg: "heredocs are not supported"}
		}
		if instr != "FROM" && instr != "ARG" && !sawFrom {
			return nil, &DockerfileError{Line: line, Msg: instr + " before FROM"}
		}
		need := func(min int) error {
			if len(words) < min {
				return &DockerfileError{Line: line, Msg: fmt.Sprintf("%s needs at least %d argument(s)", instr, min)}
			}
			return nil
		}
		switch instr {
		case "ARG":
			if err := need(1); err != nil {
				return nil, err
			}
			for _, w := range words {
				k, v, hasDefault := strings.Cut(w, "=")
				if hasDefault {
					if v, err = expand(line, v); err != nil {
						return nil, err
					}
				}
				if bv, ok := buildArgs[k]; ok {
					v = bv
				}
				args[k] = v
				if sawFrom {
					// ARGs are visible to later RUN steps as env.
					spec.Steps = append(spec.Steps, Step{Line: line, Op: OpEnv, Args: []string{k, v}})
				}
			}
		case "FROM":
			if sawFrom {
				return nil, &DockerfileError{Line: line, Msg: "multi-stage builds (a second FROM) are not supported"}
			}
			if err := need(1); err != nil {
				return nil, err
			}
			if len(words) > 1 {
				return nil, &DockerfileError{Line: line, Msg: "FROM ... AS (multi-stage builds) is not supported"}
			}
			if _, ok := flags["platform"]; ok {
				return nil, &DockerfileError{Line: line, Msg: "FROM --platform is not supported (linux/amd64 only)"}
			}
			from, err := expand(line, words[0])
			if err != nil {
				return nil, err
			}
			spec.From = from
			sawFrom = true
			// ARGs declared before FROM are only usable in FROM.
			args = map[string]string{}
		case "RUN":
			if err := need(1); err != nil {
				return nil, err
			}
			if len(flags) > 0 {
				return nil, &DockerfileError{Line: line, Msg: "RUN flags (--mount, --network, --security) are not supported"}
			}
			// The shell in the build sandbox expands variables in shell
			// form, as in Docker; exec form is taken literally.
			if isJSON {
				spec.Steps = append(spec.Steps, Step{Line: line, Op: OpRun, Args: words, Exec: true})
			} else {
				spec.Steps = append(spec.Steps, Step{Line: line, Op: OpRun, Args: []string{strings.Join(words, " ")}})
			}
		case "CMD", "ENTRYPOINT":
			st := Step{Line: line, Op: map[string]string{"CMD": OpCmd, "ENTRYPOINT": OpEntrypoint}[instr], Args: words, Exec: isJSON}
			if !isJSON {
				st.Args = []string{strings.Join(words, " ")}
			}
			spec.Steps = append(spec.Steps, st)
		case "HEALTHCHECK":
			if err := need(1); err != nil {
				return nil, err
			}
			if strings.ToUpper(words[0]) == "NONE" {
				spec.Steps = append(spec.Steps, Step{Line: line, Op: OpReady, Args: []string{""}})
				break
			}
			// words: CMD <command...>
			if strings.ToUpper(words[0]) != "CMD" || len(words) < 2 {
				return nil, &DockerfileError{Line: line, Msg: "HEALTHCHECK wants CMD <command> or NONE"}
			}
			cmd := strings.Join(words[1:], " ")
			if isJSON {
				cmd = commandString(words[1:])
			}
			spec.Steps = append(spec.Steps, Step{Line: line, Op: OpReady, Args: []string{cmd}})
		case "ENV":
			if err := need(3); err != nil {
				return nil, err
			}
			// The parser yields name, value, separator triples.
			var kv []string
			for i := 0; i+1 < len(words); i += 3 {
				v, err := expand(line, words[i+1])
				if err != nil {
					return nil, err
				}
				kv = append(kv, words[i], v)
				env = append(env, words[i]+"="+v)
			}
			spec.Steps = append(spec.Steps, Step{Line: line, Op: OpEnv, Args: kv})
		case "WORKDIR", "USER":
			if err := need(1); err != nil {
				return nil, err
			}
			v, err := expand(line, strings.Join(words, " "))
			if err != nil {
				return nil, err
			}
			spec.Steps = append(spec.Steps, Step{Line: line, Op: instr, Args: []string{v}})
		case "EXPOSE":
			if err := need(1); err != nil {
				return nil, err
			}
			var ports []string
			for _, w := range words {
				v, err := expand(line, w)
				if err != nil {
					return nil, err
				}
				ports = append(ports, v)
			}
			spec.Steps = append(spec.Steps, Step{Line: line, Op: OpExpose, Args: ports})
		case "COPY", "ADD":
			if err := need(2); err != nil {
				return nil, err
			}
			if _, ok := flags["from"]; ok {
				return nil, &DockerfileError{Line: line, Msg: "COPY --from (multi-stage builds) is not supported"}
			}
			for f := range flags {
				if f != "chown" && f != "chmod" {
					return nil, &DockerfileError{Line: line, Msg: fmt.Sprintf("%s --%s is not supported", instr, f)}
				}
			}
			var paths []string
			for _, w := range words {
				v, err := expand(line, w)
				if err != nil {
					return nil, err
				}
				paths = append(paths, v)
			}
			srcs, dest := paths[:len(paths)-1], paths[len(paths)-1]
			for _, s := range srcs {
				if strings.Contains(s, "://") {
					return nil, &DockerfileError{Line: line, Msg: "ADD from a URL is not supported; download it in a RUN step"}
				}
			}
			if contextDir == "" {
				return nil, &DockerfileError{Line: line, Msg: instr + " needs a build context directory"}
			}
			spec.Steps = append(spec.Steps, Step{Line: line, Op: OpCopy, Src: srcs, Dest: dest,
				User: flags["chown"], Mode: flags["chmod"], ContextDir: contextDir, Ignore: ignore})
		case "LABEL", "MAINTAINER", "STOPSIGNAL":
			// Metadata sandboxes have no use for.
		default:
			return nil, &DockerfileError{Line: line, Msg: fmt.Sprintf("unknown or unsupported instruction %s", instr)}
		}
	}
	if !sawFrom {
		return nil, &DockerfileError{Msg: "no FROM instruction"}
	}
	return spec, nil
}

func parseFlags(line int, raw []string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range raw {
		k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
		if k == "" || !strings.HasPrefix(f, "--") {
			return nil, &DockerfileError{Line: line, Msg: fmt.Sprintf("bad flag %q", f)}
		}
		out[k] = v
	}
	return out, nil
}

// IsDockerfileError reports whether err is a Dockerfile syntax or support error.
func IsDockerfileError(err error) bool {
	var de *DockerfileError
	return errors.As(err, &de)
}
