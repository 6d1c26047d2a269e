// Package nsjoin lets a hidden subcommand of the agentbox binary run inside
// another process's user or mount namespace, as `runc init` does: a C
// constructor runs before the Go runtime starts its threads and calls
// setns(2), which the kernel refuses for either to a multi-threaded process.
//
// It acts only on `<binary> __hook <name> --pid <pid> ...` for the hook
// names in joins; the Go code of the hook checks that the join
// happened (internal/runtime/runc's RunUserNSLimitsHook). Import it for its
// side effect from the main package.
package nsjoin

/*
#cgo CFLAGS: -Wall -Werror
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// agentbox_nsjoined is set once the constructor joined the namespace.
static int agentbox_nsjoined;

static int nsjoined(void) { return agentbox_nsjoined; }

// joins lists the hooks that run in a namespace of --pid: the user
// namespace, or (boot-id) the mount namespace, which a multi-threaded
// process cannot join either (it shares its filesystem context).
static int joins(const char *hook, int *nstype, const char **ns) {
	if (strcmp(hook, "userns-limits") == 0) {
		*nstype = CLONE_NEWUSER;
		*ns = "user";
		return 1;
	}
	if (strcmp(hook, "boot-id") == 0) {
		*nstype = CLONE_NEWNS;
		*ns = "mnt";
		return 1;
	}
	return 0;
}

__attribute__((constructor)) static void agentbox_nsjoin(int argc, char **argv) {
	int nstype;
	const char *ns;
	if (argc < 5 || strcmp(argv[1], "__hook") != 0 || !joins(argv[2], &nstype, &ns))
		return;
	const char *pid = NULL;
	for (int i = 3; i + 1 < argc; i++)
		if (strcmp(argv[i], "--pid") == 0)
			pid = argv[i + 1];
	// A malformed pid is left to the Go side, which names the flag.
	if (pid == NULL || pid[0] == '\0' || strspn(pid, "0123456789") != strlen(pid) || strlen(pid) > 10)
		return;
	char path[64];
	snprintf(path, sizeof path, "/proc/%s/ns/%s", pid, ns);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		fprintf(stderr, "agentbox __hook %s: open %s: %s\n", argv[2], path, strerror(errno));
		_exit(1);
	}
	if (setns(fd, nstype) < 0) {
		fprintf(stderr, "agentbox __hook %s: join the %s namespace of pid %s: %s\n", argv[2], ns, pid, strerror(errno));
		_exit(1);
	}
	close(fd);
	agentbox_nsjoined = 1;
}
*/
import "C"

// Joined reports whether this process joined the namespace of its hook's
// --pid before the Go runtime started. The hook cannot check that by
// comparing /proc/<pid>/ns/user with its own: once inside, it may no longer
// read the links of a process the host's user namespace made (runc init is
// not dumpable while it sets the namespaces up).
func Joined() bool { return C.nsjoined() != 0 }
