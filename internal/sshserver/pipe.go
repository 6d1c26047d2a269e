package sshserver

import (
	"fmt"
	"net"
	"os"
	"syscall"
)

// Pipe returns the two ends of a connected socket pair, for a client and
// Serve in one process. net.Pipe does not do: it has no buffer, and both
// sides of SSH write their version line before reading.
func Pipe() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "ssh-pipe")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				syscall.Close(fds[1])
			}
			return nil, nil, fmt.Errorf("socketpair: %w", err)
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}
