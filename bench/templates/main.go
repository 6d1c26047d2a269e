// Command templates benchmarks templates: build time (cold and cached) of
// a Dockerfile on the base template, sandbox create time per template, and
// the disk each additional sandbox of a template costs.
//
//	sudo go run ./bench/templates -api-url http://127.0.0.1:3000 -api-key $KEY \
//	    -template-dir /var/cache/agentbox/templates -templates base,code-interpreter-v1
//
// Builds go to a scratch template dir whose base is hard-linked from
// -template-dir, so the benchmark never touches the server's store.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agentbox/agentbox/internal/template"
)

func main() {
	apiURL := flag.String("api-url", os.Getenv("E2B_API_URL"), "server base URL")
	apiKey := flag.String("api-key", os.Getenv("E2B_API_KEY"), "API key")
	tplDir := flag.String("template-dir", "/var/cache/agentbox/templates", "the server's template dir (base is linked from it)")
	templates := flag.String("templates", "base", "comma-separated templates to measure create time and disk for")
	creates := flag.Int("creates", 5, "sandboxes per template")
	flag.Parse()
	ctx := context.Background()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "METRIC\tVALUE\tNOTE")

	if err := benchBuild(ctx, w, *tplDir); err != nil {
		log.Fatalf("build bench: %v", err)
	}
	if *apiURL != "" {
		for _, t := range strings.Split(*templates, ",") {
			if err := benchCreate(w, *apiURL, *apiKey, t, *creates); err != nil {
				log.Printf("create bench %s: %v", t, err)
			}
		}
	}
	w.Flush()
}

const dockerfile = `FROM base
ENV APP=/srv/app
WORKDIR /srv/app
COPY . .
RUN python3 -c "import compileall; compileall.compile_dir('.', quiet=1)" && echo built > /srv/app/stamp
RUN mkdir -p /opt/data && head -c 20000000 /dev/urandom > /opt/data/blob
USER user
CMD ["python3", "-m", "http.server", "8000"]
`

func benchBuild(ctx context.Context, w io.Writer, srcDir string) error {
	dir, err := os.MkdirTemp("", "agentbox-bench-templates-")
	if err != nil {
		return err
	}
	defer func() { _ = exec.Command("rm", "-rf", dir).Run() }()
	src, err := template.NewStore(srcDir, nil)
	if err != nil {
		return err
	}
	base, err := src.Get(ctx, "", "base")
	if err != nil {
		return err
	}
	if out, err := exec.Command("cp", "-al", filepath.Join(srcDir, base.ID), dir).CombinedOutput(); err != nil {
		return fmt.Errorf("link base: %v %s", err, out)
	}
	s, err := template.NewStore(dir, nil)
	if err != nil {
		return err
	}
	ctxDir := filepath.Join(dir, ".context")
	os.MkdirAll(ctxDir, 0o755)
	for i := range 200 {
		os.WriteFile(filepath.Join(ctxDir, fmt.Sprintf("mod%03d.py", i)), []byte(fmt.Sprintf("X = %d\n", i)), 0o644)
	}
	build := func() (time.Duration, error) {
		spec, err := template.ParseDockerfile(strings.NewReader(dockerfile), ctxDir, nil)
		if err != nil {
			return 0, err
		}
		// The operator's runner (chroot per RUN) stands in for the server's,
		// which runs each RUN step as a sandbox.
		spec.Name, spec.Tag, spec.Runner = "bench-app", "v1", template.OperatorRunner{}
		start := time.Now()
		_, err = s.BuildFromSpec(ctx, *spec, nil)
		return time.Since(start), err
	}
	cold, err := build()
	if err != nil {
		return err
	}
	cached, err := build()
	if err != nil {
		return err
	}
	os.WriteFile(filepath.Join(ctxDir, "mod000.py"), []byte("X = -1\n"), 0o644)
	partial, err := build()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "dockerfile build, cold\t%s\tFROM base, COPY 200 files, 2 RUN (20 MB), chroot per RUN\n", cold.Round(time.Millisecond))
	fmt.Fprintf(w, "dockerfile build, cached\t%s\tunchanged rebuild: every step from the layer cache\n", cached.Round(time.Millisecond))
	fmt.Fprintf(w, "dockerfile build, one file changed\t%s\tCOPY and both RUNs rebuilt\n", partial.Round(time.Millisecond))
	start := time.Now()
	if _, err := s.BuildFromSpec(ctx, template.BuildSpec{Name: "scratch-copy", From: "scratch"}, nil); err == nil {
		fmt.Fprintf(w, "empty template from scratch\t%s\tconfig only\n", time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func api(method, url, key string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode/100 == 2 {
		return resp.StatusCode, json.Unmarshal(b, out)
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s %s", method, url, resp.Status, b)
	}
	return resp.StatusCode, nil
}

func benchCreate(w io.Writer, apiURL, key, tpl string, n int) error {
	var info struct {
		SizeBytes int64 `json:"sizeBytes"`
	}
	if _, err := api("GET", apiURL+"/templates/"+tpl, key, nil, &info); err != nil {
		return err
	}
	var times []time.Duration
	var ids []string
	defer func() {
		for _, id := range ids {
			api("DELETE", apiURL+"/sandboxes/"+id, key, nil, nil)
		}
	}()
	for range n {
		var sb struct{ SandboxID string }
		start := time.Now()
		if _, err := api("POST", apiURL+"/sandboxes", key, map[string]any{"templateID": tpl, "timeout": 120}, &sb); err != nil {
			return err
		}
		times = append(times, time.Since(start))
		ids = append(ids, sb.SandboxID)
	}
	slices.Sort(times)
	fmt.Fprintf(w, "create %s (p50 / max of %d)\t%s / %s\tuntil envd (and the ready check) answer\n", tpl, n,
		times[len(times)/2].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond))
	// Disk per sandbox: its writable layer; the template's layers are shared.
	var total int64
	for _, id := range ids {
		total += upperBytes(id)
	}
	fmt.Fprintf(w, "disk per additional %s sandbox\t%.1f KB\twritable layer after create; template layers (%.0f MB) shared\n",
		tpl, float64(total)/float64(len(ids))/1e3, float64(info.SizeBytes)/1e6)
	return nil
}

// upperBytes is the disk used by sandbox id's overlay upper dir.
func upperBytes(id string) int64 {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.Lines(string(b)) {
		if !strings.Contains(line, id) || !strings.Contains(line, " overlay ") {
			continue
		}
		for _, o := range strings.Split(line, ",") {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				out, err := exec.Command("du", "-sb", strings.TrimSpace(v)).Output()
				if err != nil {
					return 0
				}
				var n int64
				fmt.Sscan(string(out), &n)
				return n
			}
		}
	}
	return 0
}
