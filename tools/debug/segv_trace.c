/* segv_trace: native backtraces for crashes inside Python extension modules on machines without
 * gdb (the GPU host). Build and use:
 *   gcc -O1 -g -shared -fPIC -o segv.so tools/debug/segv_trace.c -ldl
 *   LD_PRELOAD=$PWD/segv.so python3 -c "import ctypes, torch; ctypes.CDLL('$PWD/segv.so').install(); ..."
 * (call install() again after importing torch, which may take the signal handlers over; run pytest
 * with -s -p no:faulthandler). On SIGSEGV/SIGBUS/SIGILL/SIGFPE/SIGABRT it prints the faulting
 * address and a backtrace on its own signal stack (so stack overflows print too); every C++ throw
 * prints its type and the throwing frames. Resolve "lib.so(+0xOFFSET)" frames with
 * `addr2line -f -C -i -e lib.so 0xOFFSET` (a RelWithDebInfo build gives file:line). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>
static void handler(int sig, siginfo_t* si, void* ucv) {
  ucontext_t* uc = (ucontext_t*)ucv;
  void* b[48];
  int n = backtrace(b, 48);
  char msg[160];
  int l = snprintf(msg, sizeof msg, "\n*** signal %d addr %p rip %p rsp %p\n", sig, si->si_addr,
                   (void*)uc->uc_mcontext.gregs[REG_RIP], (void*)uc->uc_mcontext.gregs[REG_RSP]);
  if (write(2, msg, l) < 0) _exit(1);
  backtrace_symbols_fd(b, n, 2);
  _exit(128 + sig);
}
void install(void) {
  static char* alt = 0;
  if (!alt) {
    alt = malloc(1 << 20);
    stack_t ss = {.ss_sp = alt, .ss_size = 1 << 20, .ss_flags = 0};
    sigaltstack(&ss, 0);
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
  sigaction(SIGILL, &sa, 0);
  sigaction(SIGFPE, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
__attribute__((constructor)) static void init(void) {
  void* b[2];
  backtrace(b, 2);
  install();
}
/* Every C++ throw: its type and where it came from. */
typedef void (*throw_fn)(void*, void*, void (*)(void*));
void __cxa_throw(void* obj, void* tinfo, void (*dest)(void*)) {
  static throw_fn real = 0;
  if (!real) real = (throw_fn)dlsym(RTLD_NEXT, "__cxa_throw");
  const char* name = ((const char**)tinfo)[1];
  char msg[256];
  int l = snprintf(msg, sizeof msg, "*** throw %s\n", name);
  if (write(2, msg, l) < 0) _exit(1);
  void* b[12];
  int n = backtrace(b, 12);
  backtrace_symbols_fd(b, n, 2);
  real(obj, tinfo, dest);
  __builtin_unreachable();
}
