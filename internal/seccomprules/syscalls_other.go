//go:build !amd64

package seccomprules

// SyscallName has no table off x86_64 (the filter's architecture list is
// x86 only); syscalls are reported by number.
func SyscallName(int) string { return "" }

// SyscallNumber knows no numbers off x86_64.
func SyscallNumber(string) (int, bool) { return 0, false }
