// StopSignals: how the capstan commands wait for SIGINT or SIGTERM.
//
//   StopSignals stop;   // before starting threads: they inherit the mask
//   auto server = Server::Start(config);
//   stop.Wait();        // returns on SIGINT or SIGTERM
//   server->Shutdown();

#ifndef CAPSTAN_SERVER_STOP_SIGNALS_H_
#define CAPSTAN_SERVER_STOP_SIGNALS_H_

#include <pthread.h>
#include <signal.h>

#include <csignal>

#include "spdlog/spdlog.h"

namespace capstan::server {

class StopSignals {
 public:
  // Blocks SIGINT and SIGTERM in this thread and in every thread it starts
  // from now on, so that only Wait() receives them; ignores SIGPIPE.
  StopSignals() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    std::signal(SIGPIPE, SIG_IGN);
  }

  // Waits for SIGINT or SIGTERM and logs which came.
  void Wait() {
    int sig = 0;
    sigwait(&signals_, &sig);
    SPDLOG_INFO("received {} signal, shutting down", sig == SIGINT ? "interrupt" : "terminated");
  }

 private:
  sigset_t signals_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_STOP_SIGNALS_H_
