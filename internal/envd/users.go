package envd

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/agentbox/agentbox/internal/errdefs"
)

// User is an OS account as envd needs it: who to run as and where home is.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, including GID
	Home   string
}

// userDB reads accounts from passwd/group files. Parsing them ourselves keeps
// the static binary free of NSS and makes tests independent of libc.
type userDB struct {
	passwd string
	group  string
}

func defaultUserDB() userDB { return userDB{passwd: "/etc/passwd", group: "/etc/group"} }

// Lookup returns the named user, or ErrNotFound.
func (db userDB) Lookup(name string) (*User, error) {
	if name == "" || strings.ContainsAny(name, ":\n\x00") {
		return nil, fmt.Errorf("user %q: %w", name, errdefs.ErrInvalidArgument)
	}
	var u *User
	err := scanColon(db.passwd, func(f []string) bool {
		if len(f) < 7 || f[0] != name {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		u = &User{Name: name, UID: uint32(uid), GID: uint32(gid), Home: f[5]}
		return false
	})
	if err != nil {
		return nil, err
	}
	if u == nil {
		return nil, fmt.Errorf("user %q: %w", name, errdefs.ErrNotFound)
	}
	if u.Home == "" {
		u.Home = "/"
	}
	u.Groups = []uint32{u.GID}
	_ = scanColon(db.group, func(f []string) bool {
		if len(f) < 4 {
			return true
		}
		gid, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil || uint32(gid) == u.GID {
			return true
		}
		for _, m := range strings.Split(f[3], ",") {
			if m == name {
				u.Groups = append(u.Groups, uint32(gid))
				break
			}
		}
		return true
	})
	return u, nil
}

// UserName maps a uid to a name; unknown ids are returned as numbers.
func (db userDB) UserName(uid uint32) string { return db.idName(db.passwd, uid) }

// GroupName maps a gid to a name; unknown ids are returned as numbers.
func (db userDB) GroupName(gid uint32) string { return db.idName(db.group, gid) }

func (db userDB) idName(file string, id uint32) string {
	name := strconv.FormatUint(uint64(id), 10)
	want := name
	_ = scanColon(file, func(f []string) bool {
		if len(f) >= 3 && f[2] == want {
			name = f[0]
			return false
		}
		return true
	})
	return name
}

// scanColon calls fn with the fields of each non-comment line until fn
// returns false.
func scanColon(path string, fn func([]string) bool) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read accounts: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if !fn(strings.Split(line, ":")) {
			return nil
		}
	}
	return sc.Err()
}
