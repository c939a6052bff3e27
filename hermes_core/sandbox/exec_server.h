/* What exec_server.c and zygote.c share (built together into one static binary). */
#ifndef HERMES_EXEC_SERVER_H
#define HERMES_EXEC_SERVER_H
#include <stddef.h>

int read_full(int fd, void *buf, size_t len);
void write_full(int fd, const void *buf, size_t len);
int parse_ids(const char *host, const char *count, unsigned long *h, unsigned long *c);
int adopt_fds(const char *ctl_text, const char *exe_text);
int serve(int ctl);
int zygote(int argc, char **argv);
int join(int argc, char **argv);

#endif
