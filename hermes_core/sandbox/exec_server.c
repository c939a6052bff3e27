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
 * process that joins the session's cgroup and namespaces, where a shell and nsenter took two. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_REQUEST (8u << 20)
#define MAX_ITEMS 65536u

static int read_full(int fd, void *buf, size_t len) {
  char *at = buf;
  while (len) {
    ssize_t got = read(fd, at, len);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return -1;
    at += got, len -= (size_t)got;
  }
  return 0;
}

static void write_full(int fd, const void *buf, size_t len) {
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

/* argv: exec-server --enter [--cgroup PROCS_FILE]... [--ns FD]... -- PROGRAM [ARGS...]
 * Moves this process into each cgroup (writing 0 to its cgroup.procs), joins the namespace each FD
 * pins (closing it), then execs PROGRAM: everything it starts is inside before it runs. Any failure
 * ends here with status 125 and one line on stderr, before PROGRAM could run outside. */
static int enter(int argc, char **argv) {
  int at = 2;
  for (; at + 1 < argc && strcmp(argv[at], "--") != 0; at += 2) {
    const char *what = argv[at], *value = argv[at + 1];
    if (!strcmp(what, "--cgroup")) {
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
    fprintf(stderr, "usage: exec-server --enter [--cgroup PROCS_FILE]... [--ns FD]... -- PROGRAM [ARGS...]\n");
    return 2;
  }
  execvp(argv[at + 1], argv + at + 1);
  fprintf(stderr, "exec-server: cannot run %s: %s\n", argv[at + 1], strerror(errno));
  return 127;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--enter")) return enter(argc, argv);
  prctl(PR_SET_DUMPABLE, 0);  /* first: commands must not reach this process's fds or memory */
  prctl(PR_SET_NAME, "exec-server");  /* what `ps` shows instead of the fd it was started from */
  if (argc != 3) return 2;
  int ctl = atoi(argv[1]), exe = atoi(argv[2]);
  close(exe);
  if (dup2(ctl, 3) < 0) return 2;
  ctl = 3;
  syscall(SYS_close_range, 4, ~0u, 0);  /* namespace fds the launcher held */
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
