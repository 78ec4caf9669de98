/* The pod sandbox's process: holds the pod's namespaces open, reaps the orphans
 * that become its children (it is PID 1 when the pod shares a PID namespace),
 * and exits on SIGINT or SIGTERM. Built static, it is the whole pause image. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signal) { _exit(signal == SIGTERM || signal == SIGINT ? 0 : 1); }

static void reap(int signal) {
  (void)signal;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &on_stop, NULL);
  sigaction(SIGTERM, &on_stop, NULL);
  sigaction(SIGCHLD, &on_child, NULL);
  for (;;) pause();
}
