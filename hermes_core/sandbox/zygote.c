/* The zygote of a `local` sandbox slot: pid 1 of one bubblewrap per slot (started once, with the
 * slot's cgroup, network namespace and user namespace), which makes each session of the slot with a
 * fork and a few mounts instead of a bubblewrap of its own. The parent side is zygote.py.
 *
 * argv: exec-server --zygote CTL_FD EXE_FD. The zygote keeps the capabilities of the slot's user
 * namespace (whose root is an unprivileged host uid range) and never runs anything it is sent. Each
 * message on CTL_FD (SOCK_SEQPACKET) opens one session: u64 disk bytes, u32 id count, then the
 * NUL-terminated working directory; SCM_RIGHTS: the session's control socket. The session's pid 1 is
 * cloned into new mount, pid, ipc, uts and cgroup namespaces; it builds the session's own root
 * (session_root), enters a user namespace of its own (the zygote maps it 1:1, so ids are the slot's
 * and keyrings are the session's own), drops every capability and becomes the exec server on the
 * control socket (serve); a failure is sent there as 'F' + a message instead of 'R'. Once the zygote
 * has reaped that pid 1 the kernel has ended every process of the session, and the zygote answers 'E'
 * on CTL_FD: the parent knows the slot is empty. One session at a time; EOF on CTL_FD ends the zygote
 * and, as pid 1, everything in the slot's bubblewrap.
 *
 * The same binary joins a session from the host for a background command (join): every namespace of
 * the session's pid 1, then a pid namespace of the command's own, without capabilities. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/securebits.h>
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

#define NEWROOT "/newroot"  /* the zygote's empty folders the session's root and layer are built on */
#define STAGE "/layer"
#define SESSION_NS (CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)

static int report = -1;  /* where a failure is said: the session's control socket, or stderr */

static void fail(const char *what, const char *path) {
  char message[1024];
  int len = snprintf(message, sizeof message, "F%s%s%s: %s", what, path ? " " : "", path ? path : "",
                     strerror(errno));
  if (report >= 0) send(report, message, (size_t)len < sizeof message ? (size_t)len : sizeof message - 1, 0);
  else fprintf(stderr, "exec-server: %s\n", message + 1);
  _exit(125);
}

static void mount_or_fail(const char *source, const char *target, const char *type, unsigned long flags,
                          const char *options) {
  if (mount(source, target, type, flags, options) < 0) fail(type ? type : "bind", target);
}

/* A bind of `from` on `to` (recursive), then its flags set to `flags` (MS_RDONLY, MS_NOSUID...). */
static void bind_as(const char *from, const char *to, unsigned long flags) {
  mount_or_fail(from, to, NULL, MS_BIND | MS_REC, NULL);
  if (flags) mount_or_fail(NULL, to, NULL, MS_REMOUNT | MS_BIND | flags, NULL);
}

static void make_dirs(const char *path, mode_t mode) {
  char copy[4200];
  snprintf(copy, sizeof copy, "%s", path);
  for (char *at = copy + 1;; at++) {
    if (*at == '/' || !*at) {
      char was = *at;
      *at = 0;
      if (mkdir(copy, mode) < 0 && errno != EEXIST) fail("mkdir", copy);
      if (!(*at = was)) return;
    }
  }
}

static void touch(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0444);
  if (fd < 0) fail("create", path);
  close(fd);
}

/* NEWROOT/dev as bubblewrap's --dev makes it: a tmpfs with the host's harmless devices bound in, the
 * usual links, and a devpts instance of the session's own. */
static void make_dev(void) {
  static const char *nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
  static const char *links[][2] = {{"/proc/kcore", "core"}, {"/proc/self/fd", "fd"}, {"/proc/self/fd/0", "stdin"},
                                   {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}, {"pts/ptmx", "ptmx"}};
  char from[64], to[64];
  make_dirs(NEWROOT "/dev", 0755);
  mount_or_fail("tmpfs", NEWROOT "/dev", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
  for (size_t i = 0; i < sizeof nodes / sizeof *nodes; i++) {
    snprintf(from, sizeof from, "/dev/%s", nodes[i]);
    snprintf(to, sizeof to, NEWROOT "/dev/%s", nodes[i]);
    touch(to);
    bind_as(from, to, MS_NOSUID);
  }
  for (size_t i = 0; i < sizeof links / sizeof *links; i++) {
    snprintf(to, sizeof to, NEWROOT "/dev/%s", links[i][1]);
    if (symlink(links[i][0], to) < 0) fail("symlink", to);
  }
  make_dirs(NEWROOT "/dev/shm", 0755);
  make_dirs(NEWROOT "/dev/pts", 0755);
  mount_or_fail("devpts", NEWROOT "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620");
}

/* The session's root on NEWROOT, as bubblewrap made it for a session of its own: a tmpfs holding the
 * zygote's read-only system folders and links, a /proc of the session's pid namespace (the host's
 * kernel knobs read-only), its own /dev, and /tmp and the working directory on one tmpfs of `size`
 * bytes (the disk quota); read-only but those. Then it is the root (pivot_root): nothing of the zygote's
 * or of an earlier session's files is reachable. */
static void session_root(unsigned long long size, const char *cwd) {
  static const char *skip[] = {".", "..", "newroot", "layer", "proc", "dev", "tmp"};
  static const char *knobs[] = {NEWROOT "/proc/sys", NEWROOT "/proc/sysrq-trigger"};
  char path[4200], target[4200], options[96];
  struct stat root, entry;
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) fail("private mounts", "/");
  mount_or_fail("tmpfs", NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
  if (stat("/", &root) < 0) fail("stat", "/");
  DIR *top = opendir("/");
  if (!top) fail("opendir", "/");
  for (struct dirent *item; (item = readdir(top));) {
    int skipped = 0;
    for (size_t i = 0; i < sizeof skip / sizeof *skip; i++) skipped |= !strcmp(item->d_name, skip[i]);
    snprintf(path, sizeof path, "/%s", item->d_name);
    snprintf(target, sizeof target, NEWROOT "/%s", item->d_name);
    if (skipped || lstat(path, &entry) < 0) continue;
    if (S_ISLNK(entry.st_mode)) {
      char link[4096];
      ssize_t len = readlink(path, link, sizeof link - 1);
      if (len < 0) fail("readlink", path);
      link[len] = 0;
      if (symlink(link, target) < 0) fail("symlink", target);
    } else if (S_ISDIR(entry.st_mode)) {
      make_dirs(target, 0755);
      if (entry.st_dev != root.st_dev) bind_as(path, target, MS_RDONLY | MS_NOSUID | MS_NODEV);
    }
  }
  closedir(top);
  make_dirs(NEWROOT "/proc", 0755);
  mount_or_fail("proc", NEWROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  for (size_t i = 0; i < sizeof knobs / sizeof *knobs; i++) {
    if (access(knobs[i], F_OK) == 0) bind_as(knobs[i], knobs[i], MS_RDONLY | MS_NOSUID | MS_NODEV);
  }
  make_dev();
  snprintf(options, sizeof options, "size=%llu,mode=0755", size);
  mount_or_fail("tmpfs", STAGE, "tmpfs", MS_NOSUID | MS_NODEV, options);
  if (mkdir(STAGE "/tmp", 0755) < 0 || chmod(STAGE "/tmp", 01777) < 0) fail("mkdir", STAGE "/tmp");
  if (mkdir(STAGE "/cwd", 0755) < 0) fail("mkdir", STAGE "/cwd");
  make_dirs(NEWROOT "/tmp", 0755);
  bind_as(STAGE "/tmp", NEWROOT "/tmp", 0);
  snprintf(target, sizeof target, NEWROOT "%s", cwd);
  make_dirs(target, 0755);  /* beneath /tmp when it is there: in the layer, as bubblewrap did */
  bind_as(STAGE "/cwd", target, 0);
  if (umount2(STAGE, MNT_DETACH) < 0) fail("umount", STAGE);  /* the binds keep the tmpfs */
  mount_or_fail(NULL, NEWROOT, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
  if (chdir(NEWROOT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
    fail("pivot_root", NEWROOT);
}

/* Root of the current user namespace (the host's unprivileged id mapped to 0; a process that joined it
 * from the host is still the host's root until now), with no capability now or after any exec (an empty
 * bounding set, root's exec rules off for good) and no new privileges: what bubblewrap's --cap-drop ALL
 * gave a session, with the bounding set emptied too. */
static void drop_capabilities(void) {
  for (int cap = 0; cap < 64; cap++) {
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) fail("dropping capabilities", NULL);
  }
  if (prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
            SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED, 0, 0, 0) < 0)
    fail("securebits", NULL);
  if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) fail("becoming root of the user namespace", NULL);
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2] = {{0, 0, 0}, {0, 0, 0}};
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 || syscall(SYS_capset, &header, data) < 0 ||
      prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
    fail("dropping capabilities", NULL);
}

/* The session's pid 1, in its new namespaces: its root, then its own user namespace (mapped by the
 * zygote, told through `up`/`go`), no capabilities, then the exec server on `ctl`. */
static void session_init(int ctl, unsigned long long size, const char *cwd, int up, int go) {
  char byte = 'u';
  report = ctl;
  prctl(PR_SET_PDEATHSIG, SIGKILL);  /* the zygote gone: so is the session */
  if (read(go, &byte, 1) != 1) fail("the zygote is gone", NULL);
  session_root(size, cwd);
  if (unshare(CLONE_NEWUSER) < 0) fail("user namespace", NULL);
  write_full(up, &byte, 1);
  if (read(go, &byte, 1) != 1) fail("user namespace not mapped", NULL);
  close(up), close(go);
  drop_capabilities();
  prctl(PR_SET_PDEATHSIG, SIGKILL);  /* again: changing credentials may have cleared it */
  setsid();
  if (chdir(cwd) < 0) fail("chdir", cwd);
  _exit(serve(ctl));
}

static int write_map(int proc, const char *file, unsigned long count) {
  char map[64];
  int len = snprintf(map, sizeof map, "0 0 %lu\n", count);
  int fd = openat(proc, file, O_WRONLY | O_CLOEXEC);
  int ok = fd >= 0 && write(fd, map, (size_t)len) == len;
  if (fd >= 0) close(fd);
  return ok;
}

/* A session: its pid 1 cloned into new namespaces, its user namespace mapped 1:1 once it made one.
 * Returns pid 1's pid, or -1 (said on `session`). */
static pid_t start_session(int ctl, int session, unsigned long long size, unsigned long count, const char *cwd) {
  int up[2], go[2];
  char byte, path[64];
  if (pipe2(up, O_CLOEXEC) < 0 || pipe2(go, O_CLOEXEC) < 0) {
    send(session, "Fpipe", 5, 0);
    return -1;
  }
  pid_t init = (pid_t)syscall(SYS_clone, SESSION_NS | SIGCHLD, NULL, NULL, NULL, NULL);
  if (init == 0) {
    close(ctl), close(up[0]), close(go[1]);
    session_init(session, size, cwd, up[1], go[0]);
  }
  close(up[1]), close(go[0]);
  if (init < 0) send(session, "Fnamespaces", 11, 0);
  /* pid 1's /proc folder, from this process's own /proc (pid 1 pivots to a root of its own) */
  snprintf(path, sizeof path, "/proc/%d", init);
  int proc = init > 0 ? open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
  if (proc >= 0) write_full(go[1], "s", 1);
  if (proc >= 0 && read(up[0], &byte, 1) == 1 && write_map(proc, "uid_map", count) &&
      write_map(proc, "gid_map", count))
    write_full(go[1], "g", 1);  /* without it, pid 1 fails and says so */
  if (proc >= 0) close(proc);
  close(up[0]), close(go[1]);
  return init;
}

int zygote(int argc, char **argv) {
  if (argc != 4) return 2;
  int ctl = adopt_fds(argv[2], argv[3]);
  if (ctl < 0) return 2;
  prctl(PR_SET_DUMPABLE, 0);
  prctl(PR_SET_NAME, "zygote");
  signal(SIGPIPE, SIG_IGN);
  write_full(ctl, "R", 1);
  for (;;) {
    char request[8 + 4 + 4097], control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {request, sizeof request};
    struct msghdr message = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
    ssize_t got = recvmsg(ctl, &message, MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return 0;  /* the parent closed the slot (or died): pid 1 ends everything */
    struct cmsghdr *header = CMSG_FIRSTHDR(&message);
    if (!header || header->cmsg_type != SCM_RIGHTS || header->cmsg_len != CMSG_LEN(sizeof(int))) return 2;
    int session;
    memcpy(&session, CMSG_DATA(header), sizeof session);
    uint64_t size;
    uint32_t count;
    memcpy(&size, request, 8), memcpy(&count, request + 8, 4);
    if (got < 14 || request[got - 1] || request[12] != '/' || !count) return 2;  /* only the parent writes here */
    pid_t init = start_session(ctl, session, size, count, request + 12);
    close(session);
    int pidfd = init > 0 ? (int)syscall(SYS_pidfd_open, init, 0) : -1;
    struct pollfd both[2] = {{ctl, POLLIN, 0}, {pidfd, POLLIN, 0}};
    while (pidfd >= 0 && poll(both, 2, -1) >= 0 && !both[1].revents) {
      if (both[0].revents) return 0;  /* the parent is gone mid-session */
    }
    if (pidfd >= 0) close(pidfd);
    /* The session's pid 1: reaped once the kernel has ended every process of its namespace. */
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR) {
    }
    write_full(ctl, "E", 1);
  }
}

/* argv: exec-server --join [--cgroup PROCS_FILE]... PIDFD CWD -- PROGRAM [ARGS...]
 * From the host: into the slot's cgroup, every namespace of the session whose pid 1 PIDFD refers to
 * (its user namespace last: until then this process needs the host's powers to join the others), then
 * PROGRAM in a pid namespace of its own inside the session's (killing it ends its tree, and the
 * session's end ends it), with no capabilities. This process waits and leaves with its status. */
int join(int argc, char **argv) {
  int at = 2;
  for (; at + 1 < argc && !strcmp(argv[at], "--cgroup"); at += 2) {
    int fd = open(argv[at + 1], O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) fail("joining the cgroup", argv[at + 1]);
    close(fd);
  }
  if (at + 3 >= argc || strcmp(argv[at + 2], "--")) {
    fprintf(stderr, "usage: exec-server --join [--cgroup PROCS_FILE]... PIDFD CWD -- PROGRAM [ARGS...]\n");
    return 2;
  }
  int pidfd = atoi(argv[at]);
  const char *cwd = argv[at + 1];
  char **program = argv + at + 3;
  if (setns(pidfd, SESSION_NS | CLONE_NEWNET) < 0 || setns(pidfd, CLONE_NEWUSER) < 0) fail("joining the session", NULL);
  close(pidfd);
  for (int depth = 0; depth < 2; depth++) {  /* into the session's pid namespace, then into one of its own */
    if (depth && unshare(CLONE_NEWPID) < 0) fail("pid namespace", NULL);
    pid_t child = fork();
    if (child < 0) fail("fork", NULL);
    if (child > 0) {
      int status = 0;
      while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
      }
      _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
  }
  drop_capabilities();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  setsid();
  if (chdir(cwd) < 0) fail("chdir", cwd);
  execvp(program[0], program);
  fprintf(stderr, "exec-server: cannot run %s: %s\n", program[0], strerror(errno));
  return 127;
}
