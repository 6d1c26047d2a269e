package template

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agentbox/agentbox/internal/testutil"
)

// stockProfile is the part of Debian's /etc/profile (base-files) that
// profileWithoutID edits.
const stockProfile = `if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
else
  PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
fi
export PATH

if [ "${PS1-}" ]; then
  if [ "${BASH-}" ] && [ "$BASH" != "/bin/sh" ]; then
    :
  else
    if [ "$(id -u)" -eq 0 ]; then
      PS1='# '
    else
      PS1='$ '
    fi
  fi
fi
`

// TestProfileWithoutID runs the base template's profile edit on Debian's
// profile and sources both versions as root and as a user, in bash and in
// sh, with an `id` that leaves a mark: the edited one must set the same
// PATH and PS1 and, in bash, run no `id`; the stock one runs it (so the
// mark can tell).
func TestProfileWithoutID(t *testing.T) {
	testutil.RequireRoot(t)
	// Not t.TempDir: its parent is private, and a user sources the files too.
	dir, err := os.MkdirTemp("", "profile-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	stock, edited := filepath.Join(dir, "stock"), filepath.Join(dir, "edited")
	for _, f := range []string{stock, edited} {
		if err := os.WriteFile(f, []byte(stockProfile), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("/bin/sh", "-c", strings.ReplaceAll(profileWithoutID, "/etc/profile", edited)).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", profileWithoutID, err, out)
	}
	bin := filepath.Join(dir, "bin")
	marks := filepath.Join(dir, "marks")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	fake := "#!/bin/sh\ntouch " + marks + "/$$\nexec /usr/bin/id \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "id"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	source := func(shell, profile string, uid uint32) (out string, ranID bool) {
		t.Helper()
		ents, _ := os.ReadDir(marks)
		for _, e := range ents {
			os.Remove(filepath.Join(marks, e.Name()))
		}
		cmd := exec.Command(shell, "-c", `PS1=x; . "$1"; echo "$PATH|$PS1"`, "sh", profile)
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin"}
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s as %d: %v: %s", shell, profile, uid, err, b)
		}
		ents, _ = os.ReadDir(marks)
		return strings.TrimSpace(string(b)), len(ents) > 0
	}
	for _, tc := range []struct {
		shell   string
		uid     uint32
		wantIDs bool // the edited profile still runs id (no EUID in the shell)
	}{
		{"/bin/bash", 0, false},
		{"/bin/bash", 65534, false},
		{"/bin/sh", 0, true},
		{"/bin/sh", 65534, true},
	} {
		want, stockRan := source(tc.shell, stock, tc.uid)
		got, editedRan := source(tc.shell, edited, tc.uid)
		if got != want {
			t.Errorf("%s as %d: edited profile gives %q, stock %q", tc.shell, tc.uid, got, want)
		}
		if !stockRan {
			t.Fatalf("%s as %d: the stock profile ran no id: this test cannot tell", tc.shell, tc.uid)
		}
		if editedRan != tc.wantIDs {
			t.Errorf("%s as %d: edited profile ran id: %v, want %v", tc.shell, tc.uid, editedRan, tc.wantIDs)
		}
	}
}
