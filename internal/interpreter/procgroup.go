package interpreter

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// signalOthers signals every process of the kernel's process group but the
// kernel itself: the programs its code started. A JVM dies of SIGINT, so a
// Java interrupt reaches its children this way, as Ctrl-C reaches those of
// the other kernels with the group.
func (p *proc) signalOthers(sig syscall.Signal) {
	self := p.pid()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 3 {
			continue
		}
		pid, err1 := strconv.Atoi(filepath.Base(filepath.Dir(f)))
		pgrp, err2 := strconv.Atoi(fields[2])
		if err1 != nil || err2 != nil || pgrp != self || pid == self {
			continue
		}
		_ = syscall.Kill(pid, sig)
	}
}
