// Package porthost reads port host names, "<port>-<sandboxID>.<domain>":
// the Host form of the data plane. The gateway routes by it and the ACME
// manager decides which hosts get a certificate by it, so both read a host
// the same way.
package porthost

import (
	"errors"
	"regexp"
	"strconv"
	"strings"
)

// ErrPort: the host has the port host form, but its port is not 1-65535.
var ErrPort = errors.New("port host: port is not 1-65535")

// Host is a parsed port host.
type Host struct {
	Port   int
	ID     string // the sandbox id
	Domain string // everything after the first label, as given
	// Canonical: the port is written as strconv.Itoa writes it (no
	// leading zeros), so one port of one sandbox is one name.
	Canonical bool
}

// label matches "<port>-<sandboxID>", the first label of a port host.
var label = regexp.MustCompile(`^([0-9]{1,5})-([a-z0-9]{1,64})$`)

// Parse reads host (any case; no ":port" suffix): ok false when it is not
// a port host at all, ErrPort when it is one with an impossible port.
func Parse(host string) (h Host, ok bool, err error) {
	first, rest, found := strings.Cut(strings.ToLower(host), ".")
	if !found {
		return Host{}, false, nil
	}
	m := label.FindStringSubmatch(first)
	if m == nil {
		return Host{}, false, nil
	}
	p, _ := strconv.Atoi(m[1])
	if p < 1 || p > 65535 {
		return Host{}, true, ErrPort
	}
	return Host{Port: p, ID: m[2], Domain: rest, Canonical: strconv.Itoa(p) == m[1]}, true, nil
}
