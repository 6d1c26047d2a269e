// The hooks that run before the Go runtime starts (see nsjoin.go): a
// constructor that joins --pid's user or mount namespace, as runc's nsexec
// does, and finishes the hook's work there (hold, plug-wait, boot-id,
// userns-limits). This is their only implementation; the Go side of each
// hook only names what is wrong with arguments the constructor left alone.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

// agentbox_nsjoined is set once the constructor joined the namespace, and
// agentbox_nslimited once it set the inotify caps of --pid's user namespace
// (boot-id with --inotify-instances and --inotify-watches).
static int agentbox_nsjoined;
static int agentbox_nslimited;

int agentbox_ns_joined(void) { return agentbox_nsjoined; }
int agentbox_ns_limited(void) { return agentbox_nslimited; }

// number reports whether s is a decimal number that fits an int.
static int number(const char *s) {
	return s != NULL && s[0] != '\0' && strspn(s, "0123456789") == strlen(s) && strlen(s) <= 9;
}

static int write_file(const char *path, const char *v) {
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = write(fd, v, strlen(v));
	int err = errno;
	close(fd);
	errno = err;
	return n == (ssize_t)strlen(v) ? 0 : -1;
}

// limit_userns sets the inotify caps of pid's user namespace, which only a
// process inside it sees in /proc/sys/user: a child joins it and writes
// them, so the boot-id hook (which joins the mount namespace as the host's
// root) does both in one exec. A sandbox in the host's user namespace is
// left alone: its /proc/sys/user is the host's.
static int limit_userns(const char *pid, const char *instances, const char *watches) {
	char path[64];
	snprintf(path, sizeof path, "/proc/%s/ns/user", pid);
	struct stat theirs, self;
	if (stat(path, &theirs) < 0 || stat("/proc/self/ns/user", &self) < 0) {
		fprintf(stderr, "agentbox __hook boot-id: stat %s: %s\n", path, strerror(errno));
		return -1;
	}
	if (theirs.st_dev == self.st_dev && theirs.st_ino == self.st_ino)
		return 0;
	pid_t child = fork();
	if (child < 0) {
		fprintf(stderr, "agentbox __hook boot-id: fork: %s\n", strerror(errno));
		return -1;
	}
	if (child == 0) {
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || setns(fd, CLONE_NEWUSER) < 0) {
			fprintf(stderr, "agentbox __hook boot-id: join the user namespace of pid %s: %s\n", pid, strerror(errno));
			_exit(1);
		}
		if (write_file("/proc/sys/user/max_inotify_instances", instances) < 0 ||
		    write_file("/proc/sys/user/max_inotify_watches", watches) < 0) {
			fprintf(stderr, "agentbox __hook boot-id: set the inotify caps of pid %s's user namespace: %s\n", pid, strerror(errno));
			_exit(1);
		}
		_exit(0);
	}
	int status;
	while (waitpid(child, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

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

// hold is `__hook hold` without the Go runtime: it waits for stdin to
// close: a process to make a user namespace with, and starting the Go
// runtime would only make each idmapped mount's user namespace slower to
// come by.
static void hold(void) {
	char buf[256];
	for (;;) {
		ssize_t n = read(0, buf, sizeof buf);
		if (n == 0 || (n < 0 && errno != EINTR))
			_exit(n == 0 ? 0 : 1);
	}
}

// mount_boot_id is the boot-id hook's work done here, in the mount
// namespace joined, so the hook never starts the Go runtime: it attaches
// the detached mount it got as fd 3 over the kernel's boot_id, resolved
// without symlinks and only if that is procfs's file.
static void mount_boot_id(const char *pid) {
	int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0) {
		fprintf(stderr, "agentbox __hook boot-id: open /: %s\n", strerror(errno));
		_exit(1);
	}
	struct open_how how = {.flags = O_PATH | O_CLOEXEC, .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
	int target = syscall(SYS_openat2, root, "proc/sys/kernel/random/boot_id", &how, sizeof how);
	if (target < 0) {
		fprintf(stderr, "agentbox __hook boot-id: /proc/sys/kernel/random/boot_id in the sandbox: %s\n", strerror(errno));
		_exit(1);
	}
	struct statfs st;
	if (fstatfs(target, &st) < 0) {
		fprintf(stderr, "agentbox __hook boot-id: %s\n", strerror(errno));
		_exit(1);
	}
	if (st.f_type != PROC_SUPER_MAGIC) {
		fprintf(stderr, "agentbox __hook boot-id: /proc/sys/kernel/random/boot_id in the sandbox of pid %s is not procfs's (filesystem %#lx)\n", pid, (unsigned long)st.f_type);
		_exit(1);
	}
	if (syscall(SYS_move_mount, 3, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0) {
		fprintf(stderr, "agentbox __hook boot-id: mount over /proc/sys/kernel/random/boot_id: %s\n", strerror(errno));
		_exit(1);
	}
	_exit(0);
}

// well_formed reports whether argv[3:] is exactly the flags the server
// passes the boot-id and userns-limits hooks: --pid <n>, then (boot-id:
// optionally) --inotify-instances <n> --inotify-watches <n>. Anything else
// is left to the Go side, which names what is wrong.
static int well_formed(int argc, char **argv) {
	if (argc != 5 && argc != 9)
		return 0;
	if (strcmp(argv[3], "--pid") != 0 || !number(argv[4]) || strcmp(argv[4], "0") == 0)
		return 0;
	if (argc == 9 && (strcmp(argv[5], "--inotify-instances") != 0 || !number(argv[6]) || atoi(argv[6]) <= 0 ||
	                  strcmp(argv[7], "--inotify-watches") != 0 || !number(argv[8]) || atoi(argv[8]) <= 0))
		return 0;
	return 1;
}

// set_userns_limits is the userns-limits hook's work done here, in the
// user namespace joined, so the hook of every resume and fork never starts
// the Go runtime (malformed flags are left to runc's RunUserNSLimitsHook,
// which names what is wrong).
static void set_userns_limits(const char *pid, const char *instances, const char *watches) {
	if (write_file("/proc/sys/user/max_inotify_instances", instances) < 0 ||
	    write_file("/proc/sys/user/max_inotify_watches", watches) < 0) {
		fprintf(stderr, "agentbox __hook userns-limits: set the inotify caps of pid %s's user namespace: %s\n", pid, strerror(errno));
		_exit(1);
	}
	_exit(0);
}

// unix_address fills a with the socket at path; a path too long for
// sun_path is reached through a descriptor of its directory.
static int unix_address(const char *path, struct sockaddr_un *a) {
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	if (strlen(path) < sizeof a->sun_path) {
		strcpy(a->sun_path, path);
		return 0;
	}
	const char *slash = strrchr(path, '/');
	if (slash == NULL || slash == path)
		return -1;
	char dir[4096];
	if ((size_t)(slash - path) >= sizeof dir)
		return -1;
	memcpy(dir, path, slash - path);
	dir[slash - path] = '\0';
	int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	int n = snprintf(a->sun_path, sizeof a->sun_path, "/proc/self/fd/%d/%s", fd, slash + 1);
	return n > 0 && (size_t)n < sizeof a->sun_path ? 0 : -1;
}

// plug_wait is `__hook plug-wait --socket <path>`, the network hook of a
// restore, without the Go runtime: it hands the OCI state runc gives it on
// stdin to the server listening on the socket, which wires the restored
// netns up itself, and exits with the server's answer ("ok", or the error
// it prints).
static void plug_wait(const char *path) {
	static char state[1 << 20];
	size_t n = 0;
	for (;;) {
		ssize_t r = read(0, state + n, sizeof state - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			fprintf(stderr, "agentbox __hook plug-wait: read the OCI state: %s\n", strerror(errno));
			_exit(1);
		}
		if (r == 0)
			break;
		n += r;
		if (n == sizeof state) {
			fprintf(stderr, "agentbox __hook plug-wait: OCI state larger than %zu bytes\n", sizeof state);
			_exit(1);
		}
	}
	struct sockaddr_un a;
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0 || unix_address(path, &a) < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		fprintf(stderr, "agentbox __hook plug-wait: connect to the server at %s: %s\n", path, strerror(errno));
		_exit(1);
	}
	for (size_t off = 0; off < n;) {
		ssize_t w = send(s, state + off, n - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			fprintf(stderr, "agentbox __hook plug-wait: send the OCI state: %s\n", strerror(errno));
			_exit(1);
		}
		off += w;
	}
	shutdown(s, SHUT_WR);
	char reply[4096];
	size_t m = 0;
	for (;;) {
		ssize_t r = read(s, reply + m, sizeof reply - 1 - m);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		m += r;
		if (m == sizeof reply - 1)
			break;
	}
	reply[m] = '\0';
	if (strcmp(reply, "ok") == 0)
		_exit(0);
	fprintf(stderr, "agentbox __hook plug-wait: %s\n", m > 0 ? reply : "the server closed the connection without an answer");
	_exit(1);
}

__attribute__((constructor)) static void agentbox_nsjoin(int argc, char **argv) {
	int nstype;
	const char *ns;
	if (argc == 3 && strcmp(argv[1], "__hook") == 0 && strcmp(argv[2], "hold") == 0)
		hold();
	if (argc == 5 && strcmp(argv[1], "__hook") == 0 && strcmp(argv[2], "plug-wait") == 0 && strcmp(argv[3], "--socket") == 0)
		plug_wait(argv[4]);
	if (argc < 5 || strcmp(argv[1], "__hook") != 0 || !joins(argv[2], &nstype, &ns))
		return;
	const char *pid = NULL, *instances = NULL, *watches = NULL;
	for (int i = 3; i + 1 < argc; i++) {
		if (strcmp(argv[i], "--pid") == 0)
			pid = argv[i + 1];
		if (strcmp(argv[i], "--inotify-instances") == 0)
			instances = argv[i + 1];
		if (strcmp(argv[i], "--inotify-watches") == 0)
			watches = argv[i + 1];
	}
	// A malformed pid or cap is left to the Go side, which names the flag.
	if (!number(pid))
		return;
	if (nstype == CLONE_NEWNS && number(instances) && number(watches)) {
		if (limit_userns(pid, instances, watches) < 0)
			_exit(1);
		agentbox_nslimited = 1;
	}
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
	if (nstype == CLONE_NEWNS && well_formed(argc, argv))
		mount_boot_id(pid);
	if (nstype == CLONE_NEWUSER && argc == 9 && well_formed(argc, argv))
		set_userns_limits(pid, instances, watches);
}
