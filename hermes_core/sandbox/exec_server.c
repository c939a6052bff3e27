/* The exec server of a `local` (bubblewrap) sandbox: pid 1 of the session's pid namespace, started
 * once per session inside the sandbox (same mounts, network, cgroup and dropped capabilities as any
 * command), so each command costs a fork instead of a new bubblewrap, nsenter and shell wrapper.
 * Built by hermes_core/sandbox/exec_server.py (cc -static); the parent side is that module.
 *
 * argv: exec-server CTL_FD EXE_FD. CTL_FD is a SOCK_SEQPACKET socket to the parent; EXE_FD the
 * file this program was started from (closed at once). Each message on CTL_FD carries, as
 * SCM_RIGHTS, four fds: a command socket (SOCK_STREAM), stdin, stdout, stderr. A supervisor is
 * forked per command; it reads the request from the command socket:
 *   u32 length, then length bytes: u32 argc, u32 envc, NUL-terminated cwd, argv..., env...
 * forks the command (own session and process group, those fds as 0/1/2, nothing else open), and
 * answers 'S' + the raw wait status (i32) once the command has exited and every process it left
 * behind was killed (the supervisor is their subreaper, so double forks and setsid do not escape it).
 * A 'K' (or end of file) from the parent kills the whole tree first. EOF on CTL_FD ends the server,
 * and with pid 1 the kernel ends every process of the sandbox.
 *
 * Nothing here is secret or privileged: the process has no capabilities. It is made non-dumpable so
 * commands (same uid) cannot ptrace it or open its fds through /proc, and as pid 1 it ignores their
 * signals.
 *
 * The same binary is also the launcher that starts bubblewrap on the host (see enter()): one static
 * process that joins the session's cgroup and namespaces, where a shell and nsenter took two, and
 * with --map puts bubblewrap in a new user namespace whose root is an unprivileged host uid range
 * (the host's root is not mapped in it at all). And it makes a session's writable layer (see layer()):
 * a size-capped tmpfs, under an image's files shifted into that same id range by an idmapped mount. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "exec_server.h"

#define MAX_REQUEST (8u << 20)
#define MAX_ITEMS 65536u

int read_full(int fd, void *buf, size_t len) {
  char *at = buf;
  while (len) {
    ssize_t got = read(fd, at, len);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return -1;
    at += got, len -= (size_t)got;
  }
  return 0;
}

void write_full(int fd, const void *buf, size_t len) {
  const char *at = buf;
  while (len) {
    ssize_t put = write(fd, at, len);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return;
    at += put, len -= (size_t)put;
  }
}

/* SIGKILL every child of this process until none is left (orphans of the command's tree are
 * re-parented here: this process is their subreaper), reaping them. */
static void kill_descendants(pid_t self) {
  for (int round = 0; round < 10000; round++) {
    int found = 0;
    DIR *proc = opendir("/proc");
    struct dirent *entry;
    while (proc && (entry = readdir(proc))) {
      char path[64], stat[512];
      pid_t pid = (pid_t)atoi(entry->d_name);
      if (pid <= 0) continue;
      snprintf(path, sizeof path, "/proc/%d/stat", pid);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ssize_t got = read(fd, stat, sizeof stat - 1);
      close(fd);
      if (got <= 0) continue;
      stat[got] = 0;
      char *end = strrchr(stat, ')');
      char state;
      int ppid;
      if (end && sscanf(end + 1, " %c %d", &state, &ppid) == 2 && ppid == self) {
        found = 1;
        kill(pid, SIGKILL);
      }
    }
    if (proc) closedir(proc);
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    if (!found && waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD) return;
    usleep(1000);
  }
}

static void supervise(int sock, int in, int out, int err) {
  uint32_t length, counts[2];
  signal(SIGCHLD, SIG_DFL);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  prctl(PR_SET_PDEATHSIG, SIGKILL);  /* the server gone: so is the sandbox */
  if (read_full(sock, &length, 4) || length < 8 || length > MAX_REQUEST) _exit(2);
  char *request = malloc((size_t)length + 1);
  if (!request || read_full(sock, request, length)) _exit(2);
  request[length] = 0;
  memcpy(counts, request, 8);
  if (counts[0] < 1 || counts[0] > MAX_ITEMS || counts[1] > MAX_ITEMS) _exit(2);
  char **items = calloc((size_t)counts[0] + counts[1] + 3, sizeof(char *));
  char *at = request + 8, *end = request + length;
  size_t total = 1 + counts[0] + counts[1];
  for (size_t i = 0; i < total; i++) {
    if (at >= end) _exit(2);
    items[i + (i > counts[0])] = at;  /* cwd, argv..., NULL, env..., NULL */
    at += strlen(at) + 1;
  }
  char *cwd = items[0], **argv = items + 1, **envp = items + 2 + counts[0];
  pid_t self = getpid(), command = fork();
  if (command == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Every signal at its default: an ignored SIGTERM or SIGINT of whatever started the sandbox
     * (a script's background job ignores SIGINT) would otherwise be the command's too. */
    for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
    prctl(PR_SET_PDEATHSIG, 0);
    setsid();
    if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
    syscall(SYS_close_range, 3, ~0u, 0);
    if (chdir(cwd) != 0) {
      dprintf(2, "cannot enter the working directory %s: %s\n", cwd, strerror(errno));
      _exit(126);
    }
    execve(argv[0], argv, envp);
    dprintf(2, "%s: %s\n", argv[0], strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
  }
  close(in), close(out), close(err);
  int status = 0;
  if (command < 0) {
    status = 126 << 8;
  } else {
    int pidfd = (int)syscall(SYS_pidfd_open, command, 0);
    struct pollfd watch[2] = {{sock, POLLIN, 0}, {pidfd, POLLIN, 0}};
    for (;;) {
      if (poll(watch, 2, -1) < 0 && errno != EINTR) break;
      if (watch[1].revents) break;  /* the command exited */
      if (watch[0].revents) {       /* 'K' or the parent gave up: kill the tree */
        kill(-command, SIGKILL);
        kill(command, SIGKILL);
        break;
      }
    }
    while (waitpid(command, &status, 0) < 0 && errno == EINTR) {
    }
  }
  kill_descendants(self);  /* what the command left behind ends with it, as in its own pid namespace */
  char answer[5] = {'S'};
  memcpy(answer + 1, &status, 4);
  write_full(sock, answer, 5);
  _exit(0);
}

/* A child in a new user namespace that maps ids 0..COUNT-1 to HOST..HOST+COUNT-1 (written by this
 * process, which must be root: an unprivileged writer could map only its own uid). The child returns
 * 0 once mapped, as root of its namespace; the parent gets the child's pid; -1 on failure (said on
 * stderr). `go` false: the child only holds the namespace, until killed. */
static pid_t userns_child(unsigned long host, unsigned long count) {
  int ready[2], go[2];
  if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(go, O_CLOEXEC) < 0) return -1;
  pid_t child = fork();
  if (child == 0) {
    char byte = 'u';
    close(ready[0]), close(go[1]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (unshare(CLONE_NEWUSER) < 0) {
      fprintf(stderr, "exec-server: cannot create a user namespace: %s\n", strerror(errno));
      _exit(125);
    }
    write_full(ready[1], &byte, 1);
    close(ready[1]);
    if (read(go[0], &byte, 1) != 1) _exit(125);  /* the parent could not map it */
    close(go[0]);
    return 0;
  }
  close(ready[1]), close(go[0]);
  char byte, path[64], map[64];
  int ok = child > 0 && read(ready[0], &byte, 1) == 1;
  int len = snprintf(map, sizeof map, "0 %lu %lu\n", host, count);
  for (int i = 0; ok && i < 2; i++) {
    snprintf(path, sizeof path, "/proc/%d/%s", child, i ? "gid_map" : "uid_map");
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    ok = fd >= 0 && write(fd, map, (size_t)len) == len;
    if (!ok) fprintf(stderr, "exec-server: cannot write %s (%s): %s\n", path, map, strerror(errno));
    if (fd >= 0) close(fd);
  }
  close(ready[0]);
  if (ok) write_full(go[1], "g", 1);
  close(go[1]);
  if (!ok && child > 0) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
  }
  return ok ? child : -1;
}

int parse_ids(const char *host, const char *count, unsigned long *h, unsigned long *c) {
  char *end1, *end2;
  *h = strtoul(host, &end1, 10), *c = strtoul(count, &end2, 10);
  return *host && *count && !*end1 && !*end2 && *h > 0 && *c > 0 && *c <= 65536 && *h + *c <= 4294967294ul;
}

/* In the child of userns_child: become root of the namespace (its capabilities stay for the exec). In
 * the parent: wait for the child and leave with its status, dying with whoever started us. */
static void become_mapped_root(pid_t child) {
  if (child == 0) {
    if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) {
      fprintf(stderr, "exec-server: cannot become root of the user namespace: %s\n", strerror(errno));
      _exit(125);
    }
    return;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

/* An idmapped copy of the mount at `lower` on `target`: its files owned by host ids 0.. belong to
 * HOST.. instead (the ids of the sandbox's user namespace, see userns_child). 0, or -1 said on stderr. */
static int mount_idmapped(const char *lower, const char *target, unsigned long host, unsigned long count) {
  char path[64];
  pid_t holder = userns_child(host, count);
  if (holder == 0) for (;;) pause();  /* only holds the user namespace the mount is mapped by */
  if (holder < 0) return -1;
  snprintf(path, sizeof path, "/proc/%d/ns/user", holder);
  int userns = open(path, O_RDONLY | O_CLOEXEC);
  int tree = open_tree(AT_FDCWD, lower, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)userns};
  int mapped = userns >= 0 && tree >= 0 && mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) == 0;
  kill(holder, SIGKILL);
  waitpid(holder, NULL, 0);
  if (!mapped || move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
    fprintf(stderr, "exec-server: an idmapped mount of the image %s (needs Linux 5.19+ and a file system that "
                    "supports it): %s\n", lower, strerror(errno));
    return -1;
  }
  return 0;
}

/* The session's writable layer, in a new private mount namespace: a tmpfs of SIZE bytes on RW (so
 * its disk use is capped and never on the host's disk), owned by the sandbox's root (HOST), holding
 * cwd/ and tmp/ for a session on the host's system folders; or, for an image, the overlay RW/root of
 * LOWER (the image's root filesystem, mounted idmapped on RW/lower) and RW/upper (with RW/work).
 * RW is the same path for every session (each has its own namespace): a folder the sandbox's
 * unprivileged root can reach, as bubblewrap resolves its sources as that user. 0, or 125 said on
 * stderr. */
static int make_layer(const char *rw, const char *size_text, const char *lower, unsigned long host,
                      unsigned long count) {
  char *end, options[128];
  unsigned long long size = strtoull(size_text, &end, 10);
  if (!*size_text || *end || !size) {
    fprintf(stderr, "exec-server: bad layer size %s\n", size_text);
    return 125;
  }
#define FAIL(what) do { fprintf(stderr, "exec-server: %s: %s\n", what, strerror(errno)); return 125; } while (0)
  if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) FAIL("mount namespace");
  snprintf(options, sizeof options, "size=%llu,mode=0755,uid=%lu,gid=%lu", size, host, host);
  if (mount("tmpfs", rw, "tmpfs", MS_NOSUID | MS_NODEV, options) < 0) FAIL("the writable layer's tmpfs");
  if (chdir(rw) < 0) FAIL(rw);
  /* owned by the sandbox's root, but work/ and lower/, which only the kernel uses */
  const char *folders[] = {"cwd", "tmp", "upper", "root", "work", "lower"};
  for (int i = lower ? 2 : 0; i < (lower ? 6 : 2); i++) {
    if (mkdir(folders[i], 0755) < 0 || (i < 4 && chown(folders[i], (uid_t)host, (gid_t)host) < 0)) FAIL(folders[i]);
  }
  if (!lower && chmod("tmp", 01777) < 0) FAIL("tmp");
  if (lower) {
    if (mount_idmapped(lower, "lower", host, count) < 0) return 125;
    /* Relative to RW: the sandbox sees these options in its mountinfo, and no host path is named. */
    if (mount("overlay", "root", "overlay", 0, "lowerdir=lower,upperdir=upper,workdir=work") < 0)
      FAIL("the image's overlay");
  }
  if (chdir("/") < 0) FAIL("/");
#undef FAIL
  return 0;
}

/* argv: exec-server --layer RW HOST COUNT SIZE_BYTES [LOWER]
 * make_layer, then prints this process's pid and holds the namespace until its stdin closes (the
 * parent pins it by an fd: no host mount ever exists, and a crash frees it). */
static int layer(int argc, char **argv) {
  unsigned long host, count;
  if ((argc != 6 && argc != 7) || !parse_ids(argv[3], argv[4], &host, &count)) {
    fprintf(stderr, "usage: exec-server --layer RW HOST COUNT SIZE_BYTES [LOWER]\n");
    return 2;
  }
  int failed = make_layer(argv[2], argv[5], argc == 7 ? argv[6] : NULL, host, count);
  if (failed) return failed;
  printf("%d\n", getpid());
  fflush(stdout);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  return 0;
}

/* argv: exec-server --enter [--cgroup PROCS_FILE]... [--ns FD]... [--map HOST COUNT [--layer RW SIZE
 *        [--image LOWER]]] -- PROGRAM [ARGS...]
 * Moves this process into each cgroup (writing 0 to its cgroup.procs), joins the namespace each FD
 * pins (closing it), then execs PROGRAM: everything it starts is inside before it runs. With --map,
 * PROGRAM runs as root of a new user namespace mapped to HOST.. (see userns_child) in a child, and
 * this process waits for it; with --layer it first makes the session's writable layer (make_layer),
 * and stays in its mount namespace, which the parent may pin through /proc/PID/ns/mnt. Any failure
 * ends here with status 125 and one line on stderr, before PROGRAM could run outside. */
static int enter(int argc, char **argv) {
  int at = 2;
  unsigned long host = 0, count = 0;
  const char *rw = NULL, *size = NULL, *lower = NULL;
  for (; at + 1 < argc && strcmp(argv[at], "--") != 0; at += 2) {
    const char *what = argv[at], *value = argv[at + 1];
    if (!strcmp(what, "--map") && at + 2 < argc) {
      if (!parse_ids(value, argv[at + 2], &host, &count)) {
        fprintf(stderr, "exec-server: bad --map %s %s\n", value, argv[at + 2]);
        return 125;
      }
      at++;
    } else if (!strcmp(what, "--layer") && at + 2 < argc) {
      rw = value, size = argv[at + 2];
      at++;
    } else if (!strcmp(what, "--image")) {
      lower = value;
    } else if (!strcmp(what, "--cgroup")) {
      int fd = open(value, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || write(fd, "0", 1) != 1) {
        fprintf(stderr, "exec-server: cannot join the cgroup of %s: %s\n", value, strerror(errno));
        return 125;
      }
      close(fd);
    } else if (!strcmp(what, "--ns")) {
      char *end;
      long fd = strtol(value, &end, 10);
      if (!*value || *end || fd < 0 || fd > 65535 || setns((int)fd, 0) < 0) {
        fprintf(stderr, "exec-server: cannot join the namespace of fd %s: %s\n", value, strerror(errno));
        return 125;
      }
      close((int)fd);
    } else {
      break;
    }
  }
  if (at + 1 >= argc || strcmp(argv[at], "--") != 0) {
    fprintf(stderr, "usage: exec-server --enter [--cgroup PROCS_FILE]... [--ns FD]... [--map HOST COUNT [--layer RW "
                    "SIZE [--image LOWER]]] -- PROGRAM [ARGS...]\n");
    return 2;
  }
  if (rw && !count) {
    fprintf(stderr, "exec-server: --layer needs --map\n");
    return 2;
  }
  if (rw && make_layer(rw, size, lower, host, count)) return 125;
  if (count) {
    pid_t child = userns_child(host, count);
    if (child < 0) return 125;
    become_mapped_root(child);
  }
  execvp(argv[at + 1], argv + at + 1);
  fprintf(stderr, "exec-server: cannot run %s: %s\n", argv[at + 1], strerror(errno));
  return 127;
}

/* The server loop on CTL (see the top of this file): "R", then a supervisor per command; returns
 * when the parent closes CTL. */
int serve(int ctl) {
  prctl(PR_SET_DUMPABLE, 0);  /* first: commands must not reach this process's fds or memory */
  prctl(PR_SET_NAME, "exec-server");  /* what `ps` shows instead of the fd it was started from */
  signal(SIGCHLD, SIG_IGN);  /* pid 1: supervisors and orphans are reaped by the kernel */
  signal(SIGPIPE, SIG_IGN);
  write_full(ctl, "R", 1);
  for (;;) {
    char byte;
    char control[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {&byte, 1};
    struct msghdr message = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
    ssize_t got = recvmsg(ctl, &message, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return 0;  /* the parent closed the sandbox (or died) */
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    if (!header || header->cmsg_type != SCM_RIGHTS || header->cmsg_len != CMSG_LEN(4 * sizeof(int))) {
      if (header && header->cmsg_type == SCM_RIGHTS) {
        int *fds = (int *)CMSG_DATA(header);
        for (size_t i = 0; i < (header->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) close(fds[i]);
      }
      continue;
    }
    int fds[4];
    memcpy(fds, CMSG_DATA(header), sizeof fds);
    pid_t supervisor = fork();
    if (supervisor == 0) {
      close(ctl);
      for (int i = 0; i < 4; i++) fcntl(fds[i], F_SETFD, 0);
      supervise(fds[0], fds[1], fds[2], fds[3]);
    }
    for (int i = 0; i < 4; i++) close(fds[i]);
  }
}

/* argv: exec-server CTL_FD EXE_FD, or a mode (--enter, --layer, --zygote, --join) and its arguments. */
int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--enter")) return enter(argc, argv);
  if (argc > 1 && !strcmp(argv[1], "--layer")) return layer(argc, argv);
  if (argc > 1 && !strcmp(argv[1], "--zygote")) return zygote(argc, argv);
  if (argc > 1 && !strcmp(argv[1], "--join")) return join(argc, argv);
  if (argc != 3) return 2;
  int ctl = adopt_fds(argv[1], argv[2]);
  return ctl < 0 ? 2 : serve(ctl);
}

/* CTL as fd 3 and nothing else open above it (EXE, and namespace fds the launcher held, closed). */
int adopt_fds(const char *ctl_text, const char *exe_text) {
  int ctl = atoi(ctl_text), exe = atoi(exe_text);
  close(exe);
  if (dup2(ctl, 3) < 0) return -1;
  syscall(SYS_close_range, 4, ~0u, 0);
  return 3;
}
