/*
 * floor: the least a program can do to measure what sonde measures, for bench/compare.py.
 *
 * No framing, no statistics beyond one sort at the end, no threads, no timers: what is left is
 * the kernel and the machine. compare.py compiles it with `gcc -O2` and prints sonde / floor
 * next to sonde / peer. Loopback only by intent; every run is bounded by -t.
 *
 *   floor udp-echo PORT [--busy] [--cpu N]         echo every datagram (one at a time)
 *   floor tcp-echo PORT [--busy] [--cpu N]         echo each connection's bytes, one connection
 *                                                  at a time
 *   floor udp-ping HOST PORT -m SIZE -t SECS [-w SECS] [--busy] [--cpu N]
 *   floor tcp-ping HOST PORT -m SIZE -t SECS [-w SECS] [--busy] [--cpu N]
 *                                                  closed loop, one message in flight; prints
 *                                                  {"p50_ns":..,"samples":..} of the RTTs after
 *                                                  the warm-up (-w, default 1 s)
 *   floor tcp-sink PORT [-r SIZE]                  read each connection to EOF, at most SIZE
 *                                                  bytes per recv (default 512 KiB, sonde's
 *                                                  default), then answer with the bytes and the
 *                                                  ns from first to last read
 *   floor tcp-stream HOST PORT -t SECS [-l SIZE]   write SIZE-byte buffers (default 128 KiB) for
 *                                                  SECS, then print the sink's bits per second
 *   floor udp-sink PORT                            count datagrams on PORT (recvmmsg); a TCP
 *                                                  connection on the same port asks for the count
 *   floor udp-blast HOST PORT -m SIZE -t SECS      sendmmsg batches of 64 SIZE-byte datagrams for
 *                                                  SECS, then print the sink's received rate
 *
 *   floor tcp-rr-echo PORT -m REQ -R RESP -T THREADS
 *                                                  answer every REQ bytes of each connection
 *                                                  with RESP bytes; connections spread over
 *                                                  THREADS threads, one epoll loop each
 *   floor tcp-rr HOST PORT -F FLOWS -D DEPTH -m REQ -R RESP -T THREADS -t SECS [-w SECS]
 *                                                  FLOWS connections, each with DEPTH requests
 *                                                  in flight (closed loop), over THREADS epoll
 *                                                  loops (a thread with one flow blocks in
 *                                                  recv instead); prints {"tps":..,
 *                                                  "transactions":..} after the warm-up
 *   floor has-uring                                exit status 0 when built with --uring
 *   floor tcp-rr-echo ... --uring                 as above, each thread an io_uring loop
 *   floor tcp-rr ... --uring                      instead of epoll (every recv and send a
 *                                                  submission, all of a wake-up's in one
 *                                                  io_uring_enter; one flow too): whether
 *                                                  io_uring beats the epoll loops, as
 *                                                  docs/performance.md reports. Built only
 *                                                  where liburing's header is installed
 *   floor udp-rr-echo PORT -m REQ -R RESP -T THREADS
 *                                                  THREADS sockets on PORT (SO_REUSEPORT, a
 *                                                  datagram's socket picked by the client
 *                                                  thread number it carries), each answering
 *                                                  every datagram with RESP bytes
 *   floor udp-rr HOST PORT -F FLOWS -D DEPTH -m REQ -R RESP -T THREADS -t SECS [-w SECS]
 *                                                  as tcp-rr over UDP flows (a connected
 *                                                  socket each); a lost datagram stalls its flow
 *                                                  (no timeout: loopback loses none at these
 *                                                  depths)
 *
 *   floor mesh PORT -N PEERS -P PEER_PORT [-i MS] [-k MS] [--any] -t SECS
 *                                                  a mesh agent's probe work and nothing else
 *                                                  (bench/mesh_budget.py --floor): probes PEERS
 *                                                  peers at 127.1.0.1 upwards on PEER_PORT over
 *                                                  UDP and TCP every -i ms (default 10000), the
 *                                                  timer coalesced to -k ms (default 5), and
 *                                                  answers probes on PORT; -N 0 only answers
 *                                                  (the floor's responder); prints counts
 *
 * --busy: non-blocking sockets polled in a spin loop (plus SO_BUSY_POLL, where permitted). A busy
 * echo spins only while traffic comes (1 s without a message and it blocks again), so an idle
 * floor server costs no CPU between runs. --cpu N: pin the thread to CPU N.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <linux/filter.h>
#if __has_include(<liburing.h>)
#include <liburing.h>
#define HAVE_URING 1
#endif

#define MAX_MSG 65536
#define BATCH 64
#define MAX_SECS 120
/* A TCP read of the stream sink; iperf3 and sonde read 128 KiB or more. */
#define SINK_BUF (512 * 1024)
/* A busy echo goes back to blocking after this long without a message. */
#define SPIN_IDLE_NS 1000000000ULL

static int busy;
/* --uring: tcp-rr and tcp-rr-echo run io_uring loops instead of epoll. */
static int uring;

static void die(const char *what) {
    perror(what);
    exit(1);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu) {
    if (cpu < 0)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        die("sched_setaffinity");
}

/* SO_BUSY_POLL where the kernel permits it (raising it needs CAP_NET_ADMIN); loopback has no
 * NAPI context to poll, so it changes nothing there, but sonde --busy-poll asks for it too. */
static void busy_poll_opt(int fd) {
#ifdef SO_BUSY_POLL
    int us = 50;
    (void)setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &us, sizeof us);
#else
    (void)fd;
#endif
}

static struct sockaddr_in addr_of(const char *host, int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        fprintf(stderr, "floor: %s is not an IPv4 address\n", host);
        exit(2);
    }
    return a;
}

static int bound(int type, int port) {
    int fd = socket(AF_INET, type, 0);
    if (fd < 0)
        die("socket");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = addr_of("127.0.0.1", port);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0)
        die("bind");
    if (type == SOCK_STREAM && listen(fd, 16) != 0)
        die("listen");
    return fd;
}

static int connected(int type, const char *host, int port) {
    int fd = socket(AF_INET, type, 0);
    if (fd < 0)
        die("socket");
    struct sockaddr_in a = addr_of(host, port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        die("connect");
    if (type == SOCK_STREAM) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

/* Blocks until fd is readable (the way back from spinning to sleeping). */
static void wait_readable(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
}

/* One recv: blocking, or spinning on MSG_DONTWAIT until data, `until` (0: no deadline, but a
 * spin of SPIN_IDLE_NS without data falls back to blocking). */
static ssize_t recv_one(int fd, void *buf, size_t len, struct sockaddr_in *from, socklen_t *fl,
                        uint64_t until) {
    if (!busy)
        return recvfrom(fd, buf, len, 0, (struct sockaddr *)from, fl);
    uint64_t since = now_ns();
    for (;;) {
        ssize_t n = recvfrom(fd, buf, len, MSG_DONTWAIT, (struct sockaddr *)from, fl);
        if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return n;
        uint64_t t = now_ns();
        if (until && t >= until)
            return -1;
        if (!until && t - since >= SPIN_IDLE_NS) {
            wait_readable(fd);
            since = now_ns();
        }
    }
}

/* Writes all of buf; -1 when the peer is gone (a server goes on with the next one). */
static int send_all(int fd, const char *buf, size_t len) {
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                continue;
            return -1;
        }
        off += (size_t)n;
    }
    return 0;
}

/* A client's send_all: a failure ends the run. */
static void must_send(int fd, const char *buf, size_t len) {
    if (send_all(fd, buf, len) != 0)
        die("send");
}

static void udp_echo(int port) {
    static char buf[MAX_MSG];
    int fd = bound(SOCK_DGRAM, port);
    if (busy)
        busy_poll_opt(fd);
    for (;;) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recv_one(fd, buf, sizeof buf, &from, &fl, 0);
        if (n < 0)
            continue;
        (void)sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&from, fl);
    }
}

static void tcp_echo(int port) {
    static char buf[MAX_MSG];
    int lfd = bound(SOCK_STREAM, port);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (busy)
            busy_poll_opt(fd);
        for (;;) {
            ssize_t n = recv_one(fd, buf, sizeof buf, NULL, NULL, 0);
            if (n <= 0)
                break;
            if (send_all(fd, buf, (size_t)n) != 0)
                break;
        }
        close(fd);
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Closed-loop ping-pong over a connected socket; TCP reads until the whole reply is in. */
static void ping(int tcp, const char *host, int port, size_t size, double secs, double warm) {
    static char out[MAX_MSG], in[MAX_MSG];
    int fd = connected(tcp ? SOCK_STREAM : SOCK_DGRAM, host, port);
    if (busy)
        busy_poll_opt(fd);
    /* A closed loop on loopback does at most a few hundred thousand round trips a second. */
    size_t cap = (size_t)(secs * 400000.0) + 1024, n = 0;
    uint64_t *rtt = malloc(cap * sizeof *rtt);
    if (!rtt)
        die("malloc");
    uint64_t start = now_ns();
    uint64_t measure_from = start + (uint64_t)(warm * 1e9);
    uint64_t end = measure_from + (uint64_t)(secs * 1e9);
    uint64_t lost = 0;
    for (uint64_t seq = 0;; seq++) {
        uint64_t t0 = now_ns();
        if (t0 >= end)
            break;
        memcpy(out, &seq, size < 8 ? size : 8);
        must_send(fd, out, size);
        size_t got = 0;
        int ok = 1;
        while (got < size) {
            /* UDP: a reply not back within 1 s is lost (on loopback, never in practice). */
            ssize_t r;
            if (busy) {
                r = recv_one(fd, in + got, sizeof in - got, NULL, NULL, t0 + 1000000000ULL);
            } else {
                struct timeval tv = {.tv_sec = 1};
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
                r = recv(fd, in + got, sizeof in - got, 0);
            }
            if (r <= 0) {
                if (tcp && r == 0) {
                    fprintf(stderr, "floor: peer closed\n");
                    exit(1);
                }
                ok = 0;
                break;
            }
            got += (size_t)r;
            if (!tcp)
                break;
        }
        uint64_t t1 = now_ns();
        if (!ok) {
            lost++;
            continue;
        }
        if (t0 >= measure_from && n < cap)
            rtt[n++] = t1 - t0;
    }
    close(fd);
    if (n == 0) {
        fprintf(stderr, "floor: no replies\n");
        exit(1);
    }
    qsort(rtt, n, sizeof *rtt, cmp_u64);
    printf("{\"p50_ns\": %llu, \"min_ns\": %llu, \"samples\": %zu, \"lost\": %llu}\n",
           (unsigned long long)rtt[(n - 1) / 2], (unsigned long long)rtt[0], n,
           (unsigned long long)lost);
    free(rtt);
}

static void tcp_sink(int port, size_t rsize) {
    static char buf[SINK_BUF];
    int lfd = bound(SOCK_STREAM, port);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            continue;
        uint64_t bytes = 0, first = 0, last = 0;
        for (;;) {
            ssize_t n = recv(fd, buf, rsize, 0);
            if (n <= 0)
                break;
            last = now_ns();
            if (!first)
                first = last;
            bytes += (uint64_t)n;
        }
        uint64_t report[2] = {bytes, last - first};
        (void)send_all(fd, (const char *)report, sizeof report);
        close(fd);
    }
}

static void tcp_stream(const char *host, int port, double secs, size_t len) {
    static char buf[4 * 1024 * 1024];
    if (len > sizeof buf)
        len = sizeof buf;
    int fd = connected(SOCK_STREAM, host, port);
    /* No TCP_NODELAY: a bulk sender, as iperf3 and sonde throughput. */
    int zero = 0;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &zero, sizeof zero);
    uint64_t end = now_ns() + (uint64_t)(secs * 1e9);
    while (now_ns() < end)
        must_send(fd, buf, len);
    shutdown(fd, SHUT_WR);
    uint64_t report[2];
    size_t got = 0;
    while (got < sizeof report) {
        ssize_t n = recv(fd, (char *)report + got, sizeof report - got, 0);
        if (n <= 0)
            die("recv report");
        got += (size_t)n;
    }
    double s = (double)report[1] / 1e9;
    printf("{\"bits_per_second\": %.0f, \"bytes\": %llu, \"seconds\": %.6f}\n",
           s > 0 ? (double)report[0] * 8 / s : 0.0, (unsigned long long)report[0], s);
}

/* UDP datagrams on PORT are counted; a TCP connection to PORT gets the count since the previous
 * one (after a short drain) and resets it. */
static void udp_sink(int port) {
    static char bufs[BATCH][2048];
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    int ufd = bound(SOCK_DGRAM, port);
    int rcvbuf = 4 * 1024 * 1024;
    setsockopt(ufd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    int lfd = bound(SOCK_STREAM, port);
    for (int i = 0; i < BATCH; i++) {
        iov[i].iov_base = bufs[i];
        iov[i].iov_len = sizeof bufs[i];
        memset(&msgs[i], 0, sizeof msgs[i]);
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t count = 0, first = 0, last = 0;
    for (;;) {
        struct pollfd p[2] = {{.fd = ufd, .events = POLLIN}, {.fd = lfd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0)
            continue;
        if (p[0].revents & POLLIN) {
            /* Drain the socket before polling again: one poll per burst, not per batch. */
            for (;;) {
                int n = recvmmsg(ufd, msgs, BATCH, MSG_DONTWAIT, NULL);
                if (n <= 0)
                    break;
                last = now_ns();
                if (!first)
                    first = last;
                count += (uint64_t)n;
            }
        }
        if (p[1].revents & POLLIN) {
            int fd = accept(lfd, NULL, NULL);
            if (fd < 0)
                continue;
            /* The sender asks once it has stopped: drain what is still queued first. */
            char req;
            if (recv(fd, &req, 1, 0) == 1) {
                for (;;) {
                    int n = recvmmsg(ufd, msgs, BATCH, MSG_DONTWAIT, NULL);
                    if (n <= 0)
                        break;
                    last = now_ns();
                    count += (uint64_t)n;
                }
                uint64_t report[2] = {count, first ? last - first : 0};
                (void)send_all(fd, (const char *)report, sizeof report);
            }
            close(fd);
            count = first = last = 0;
        }
    }
}

static void udp_blast(const char *host, int port, size_t size, double secs) {
    static char payload[2048];
    struct mmsghdr msgs[BATCH];
    if (size > sizeof payload)
        size = sizeof payload;
    struct iovec iov = {.iov_base = payload, .iov_len = size};
    int fd = connected(SOCK_DGRAM, host, port);
    memset(msgs, 0, sizeof msgs);
    for (int i = 0; i < BATCH; i++) {
        msgs[i].msg_hdr.msg_iov = &iov;
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    uint64_t end = now_ns() + (uint64_t)(secs * 1e9), sent = 0;
    while (now_ns() < end) {
        int n = sendmmsg(fd, msgs, BATCH, 0);
        if (n > 0)
            sent += (uint64_t)n;
        else if (errno != ENOBUFS && errno != EAGAIN && errno != ECONNREFUSED)
            die("sendmmsg");
    }
    int c = connected(SOCK_STREAM, host, port);
    usleep(100000);
    must_send(c, "?", 1);
    uint64_t report[2];
    size_t got = 0;
    while (got < sizeof report) {
        ssize_t n = recv(c, (char *)report + got, sizeof report - got, 0);
        if (n <= 0)
            die("recv report");
        got += (size_t)n;
    }
    double s = (double)report[1] / 1e9;
    printf("{\"pps\": %.0f, \"received\": %llu, \"sent\": %llu, \"seconds\": %.6f}\n",
           s > 0 ? (double)report[0] / s : 0.0, (unsigned long long)report[0],
           (unsigned long long)sent, s);
}

/* ---- request/response over many connections (tcp-rr, tcp-rr-echo) ---- */

#define RR_MAX_FD 65536
#define RR_MAX_THREADS 64
static const char rr_zeros[MAX_MSG];
/* Per descriptor: bytes of the request (echo) or response (client) read so far. Each
 * descriptor belongs to one thread. */
static uint32_t rr_partial[RR_MAX_FD];
static size_t rr_req, rr_resp;

static void nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        die("fcntl");
}

/* Writes n zero bytes, waiting for room when the socket is full (small messages: rare). */
static void rr_write(int fd, uint64_t n) {
    while (n > 0) {
        size_t chunk = n > MAX_MSG ? MAX_MSG : (size_t)n;
        ssize_t w = send(fd, rr_zeros, chunk, MSG_NOSIGNAL);
        if (w > 0) {
            n -= (uint64_t)w;
        } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, 100);
        } else {
            return; /* the peer went away */
        }
    }
}

#ifdef HAVE_URING
struct rr_client;
static void tcp_rr_echo_uring(int l, int threads);
static int rr_accept(int l);
static void rr_client_uring(struct rr_client *c);
static void uring_bufs_alloc(void);
#endif

static void *rr_echo_thread(void *arg) {
    int ep = (int)(intptr_t)arg;
    struct epoll_event evs[256];
    static __thread char buf[MAX_MSG];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                close(fd);
                continue;
            }
            if (r < 0)
                continue;
            uint64_t got = rr_partial[fd] + (uint64_t)r;
            rr_partial[fd] = (uint32_t)(got % rr_req);
            rr_write(fd, (got / rr_req) * rr_resp);
        }
    }
    return NULL;
}

/* The echo's next connection, with Nagle off and no partial request yet. */
static int rr_accept(int l) {
    int one = 1;
    for (;;) {
        int c = accept(l, NULL, NULL);
        if (c >= 0 && c < RR_MAX_FD) {
            setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            rr_partial[c] = 0;
            return c;
        }
        if (c >= 0)
            close(c);
    }
}

static void tcp_rr_echo(int port, int threads) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = addr_of("127.0.0.1", port);
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 4096) != 0)
        die("listen");
#ifdef HAVE_URING
    if (uring) {
        tcp_rr_echo_uring(l, threads);
        return;
    }
#endif
    int eps[RR_MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        pthread_t th;
        if ((eps[t] = epoll_create1(0)) < 0)
            die("epoll_create1");
        if (pthread_create(&th, NULL, rr_echo_thread, (void *)(intptr_t)eps[t]) != 0)
            die("pthread_create");
    }
    for (unsigned next = 0;; next++) {
        int c = rr_accept(l);
        nonblock(c);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = c};
        if (epoll_ctl(eps[next % (unsigned)threads], EPOLL_CTL_ADD, c, &ev) != 0)
            die("epoll_ctl");
    }
}

struct rr_client {
    int *fds, nfds, depth;
    uint64_t warm_end, end, transactions;
    /* What a request carries: zeros, but over UDP its first four bytes are the client thread's
     * number (big-endian), which the echo's reuseport program reads to pick the socket. */
    char req[MAX_MSG];
};

/* Deals the flows to the threads as cards: thread t gets flows t, t + T, t + 2T ... (into `ord`,
 * thread t's from starts[t] to starts[t + 1]). The echo hands accepted connections to its
 * threads in turn, so with as many threads at each end, each client thread talks to one echo
 * thread only and the pair wakes each other on one CPU; contiguous blocks made every client
 * thread depend on both echo threads, which halved the transactions at 16 flows. (Over UDP
 * the pairing is the echo's reuseport program's, by the thread number in each request.) */
static void interleave(const int *fds, int flows, int threads, int *ord, int *starts) {
    int k = 0;
    for (int t = 0; t < threads; t++) {
        starts[t] = k;
        for (int i = t; i < flows; i += threads)
            ord[k++] = fds[i];
    }
    starts[threads] = k;
}

/* A thread with one flow needs no readiness loop: it blocks in recv, the fewest system calls
 * a transaction can take (a send and a recv), as a one-flow tool does. A receive timeout of
 * 100 ms lets it see the end of the run if the peer falls silent. `unit` is the response size
 * (TCP: bytes of the stream; UDP: 0, one datagram is one response). */
static void rr_one_flow(struct rr_client *c, size_t unit, char *buf, size_t len) {
    int fd = c->fds[0];
    int fl = fcntl(fd, F_GETFL);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0 ||
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
        die("blocking socket");
    for (int d = 0; d < c->depth; d++)
        if (send(fd, c->req, rr_req, MSG_NOSIGNAL) < 0)
            die("send");
    uint64_t partial = 0, now;
    while ((now = now_ns()) < c->end) {
        ssize_t r = recv(fd, buf, len, 0);
        if (r <= 0) {
            if (r == 0 || (errno != EAGAIN && errno != EINTR))
                die("recv");
            continue;
        }
        uint64_t done = 1;
        if (unit > 0) {
            partial += (uint64_t)r;
            done = partial / unit;
            partial %= unit;
        }
        if (now >= c->warm_end)
            c->transactions += done;
        for (uint64_t i = 0; i < done; i++)
            if (send(fd, c->req, rr_req, MSG_NOSIGNAL) < 0)
                die("send");
    }
}

static void *rr_client_thread(void *arg) {
    struct rr_client *c = arg;
    static __thread char buf[MAX_MSG];
#ifdef HAVE_URING
    if (uring) {
        rr_client_uring(c);
        return NULL;
    }
#endif
    if (c->nfds == 1) {
        rr_one_flow(c, rr_resp, buf, sizeof buf);
        return NULL;
    }
    int ep = epoll_create1(0);
    if (ep < 0)
        die("epoll_create1");
    for (int i = 0; i < c->nfds; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = c->fds[i]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fds[i], &ev) != 0)
            die("epoll_ctl");
        rr_write(c->fds[i], (uint64_t)c->depth * rr_req);
    }
    struct epoll_event evs[256];
    uint64_t now;
    while ((now = now_ns()) < c->end) {
        int n = epoll_wait(ep, evs, 256, 10);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) {
                if (r == 0 || (errno != EAGAIN && errno != EINTR))
                    die("recv");
                continue;
            }
            uint64_t got = rr_partial[fd] + (uint64_t)r;
            rr_partial[fd] = (uint32_t)(got % rr_resp);
            uint64_t done = got / rr_resp;
            if (now >= c->warm_end)
                c->transactions += done;
            rr_write(fd, done * rr_req);
        }
    }
    close(ep);
    return NULL;
}

static void tcp_rr(const char *host, int port, int flows, int depth, int threads, double secs,
                   double warm) {
    if (threads > flows)
        threads = flows;
    int *fds = calloc((size_t)flows, sizeof *fds);
    if (!fds)
        die("calloc");
    for (int i = 0; i < flows; i++) {
        fds[i] = connected(SOCK_STREAM, host, port);
        if (fds[i] >= RR_MAX_FD)
            die("descriptor out of range");
        nonblock(fds[i]);
    }
    int *ord = calloc((size_t)flows, sizeof *ord);
    int starts[RR_MAX_THREADS + 1];
    if (!ord)
        die("calloc");
    interleave(fds, flows, threads, ord, starts);
#ifdef HAVE_URING
    if (uring)
        uring_bufs_alloc();
#endif
    uint64_t start = now_ns();
    static struct rr_client cs[RR_MAX_THREADS];
    pthread_t ths[RR_MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        cs[t] = (struct rr_client){
            .fds = ord + starts[t],
            .nfds = starts[t + 1] - starts[t],
            .depth = depth,
            .warm_end = start + (uint64_t)(warm * 1e9),
            .end = start + (uint64_t)((warm + secs) * 1e9),
        };
        if (pthread_create(&ths[t], NULL, rr_client_thread, &cs[t]) != 0)
            die("pthread_create");
    }
    uint64_t total = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(ths[t], NULL);
        total += cs[t].transactions;
    }
    for (int i = 0; i < flows; i++)
        close(fds[i]);
    free(fds);
    free(ord);
    printf("{\"tps\": %.1f, \"transactions\": %llu, \"seconds\": %.3f}\n", (double)total / secs,
           (unsigned long long)total, secs);
}

#ifdef HAVE_URING
/* ---- the same request/response loops over io_uring (--uring) ----
 *
 * Each thread owns a ring (single issuer, task work deferred to its own io_uring_enter: the
 * kernel's fastest setting for one thread per ring). Every flow has one recv outstanding into
 * its own buffer; a completed recv queues the sends it owes (zeros, so two sends of one flow in
 * flight at once may complete in any order: only the byte count matters here) and the flow's
 * next recv. Everything a wake-up queued goes to the kernel in the one io_uring_enter that also
 * waits for the next completion: the system calls an epoll loop makes per transaction (a recv
 * and a send, plus its share of an epoll_wait) become a share of one. */

#define URING_BUF 2048
#define URING_ENTRIES 4096
enum { OP_RECV = 0, OP_SEND = 1, OP_NEWFD = 2 };

static uint64_t ud(int fd, int op, uint64_t len) {
    return (uint64_t)(uint32_t)fd | ((uint64_t)op << 32) | (len << 34);
}

static void uring_init(struct io_uring *ring) {
    struct io_uring_params p = {0};
    p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN;
    if (io_uring_queue_init_params(URING_ENTRIES, ring, &p) < 0) {
        memset(&p, 0, sizeof p); /* kernels before 6.1: without the two flags */
        if (io_uring_queue_init_params(URING_ENTRIES, ring, &p) < 0)
            die("io_uring_queue_init");
    }
}

static struct io_uring_sqe *sqe_of(struct io_uring *ring) {
    struct io_uring_sqe *e = io_uring_get_sqe(ring);
    if (!e) {
        io_uring_submit(ring);
        if (!(e = io_uring_get_sqe(ring)))
            die("io_uring_get_sqe");
    }
    return e;
}

static void uring_recv(struct io_uring *ring, int fd, char *buf) {
    struct io_uring_sqe *e = sqe_of(ring);
    io_uring_prep_recv(e, fd, buf, URING_BUF, 0);
    io_uring_sqe_set_data64(e, ud(fd, OP_RECV, 0));
}

/* Queues n zero bytes on fd, in sends of at most MAX_MSG. */
static void uring_send(struct io_uring *ring, int fd, uint64_t n) {
    while (n > 0) {
        size_t chunk = n > MAX_MSG ? MAX_MSG : (size_t)n;
        struct io_uring_sqe *e = sqe_of(ring);
        io_uring_prep_send(e, fd, rr_zeros, chunk, MSG_NOSIGNAL);
        io_uring_sqe_set_data64(e, ud(fd, OP_SEND, chunk));
        n -= chunk;
    }
}

/* One flow's buffer, by descriptor (each descriptor belongs to one thread). */
static char (*uring_bufs)[URING_BUF];

static void uring_bufs_alloc(void) {
    if (!uring_bufs && !(uring_bufs = calloc(RR_MAX_FD, URING_BUF)))
        die("calloc");
}

/* A send's completion: a short send queues the rest; an error is the peer gone. Returns 0 when
 * the flow is over. */
static int uring_sent(struct io_uring *ring, int fd, int res, uint64_t len) {
    if (res < 0)
        return res == -EAGAIN || res == -EINTR ? (uring_send(ring, fd, len), 1) : 0;
    if ((uint64_t)res < len)
        uring_send(ring, fd, len - (uint64_t)res);
    return 1;
}

struct uring_echo {
    int newfd[2]; /* the accept loop writes each new descriptor here */
    int incoming;
};

/* Handles every completion ready: a recv queues the sends it owes (`out` bytes for each whole
 * `in` bytes received) and the flow's next recv; a short send queues the rest. Returns the
 * whole messages received. On the echo (u set) a flow's close closes it and a descriptor from
 * the accept loop gets its first recv; on the client (u NULL) either end of a flow is fatal. */
static uint64_t uring_reap(struct io_uring *ring, size_t in, size_t out, struct uring_echo *u) {
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    uint64_t messages = 0;
    io_uring_for_each_cqe(ring, head, cqe) {
        seen++;
        uint64_t d = cqe->user_data;
        int fd = (int)(uint32_t)d, op = (int)((d >> 32) & 3), res = cqe->res;
        if (op == OP_NEWFD) {
            if (res == (int)sizeof u->incoming)
                uring_recv(ring, u->incoming, uring_bufs[u->incoming]);
            struct io_uring_sqe *e = sqe_of(ring);
            io_uring_prep_read(e, u->newfd[0], &u->incoming, sizeof u->incoming, 0);
            io_uring_sqe_set_data64(e, ud(u->newfd[0], OP_NEWFD, 0));
        } else if (op == OP_SEND) {
            if (!uring_sent(ring, fd, res, d >> 34) && !u)
                die("send");
        } else if (res == 0 || (res < 0 && res != -EAGAIN && res != -EINTR)) {
            if (!u)
                die("recv");
            close(fd); /* the client's close, or an error */
        } else {
            if (res > 0) {
                uint64_t got = rr_partial[fd] + (uint64_t)res;
                rr_partial[fd] = (uint32_t)(got % in);
                messages += got / in;
                uring_send(ring, fd, (got / in) * out);
            }
            uring_recv(ring, fd, uring_bufs[fd]);
        }
    }
    io_uring_cq_advance(ring, seen);
    return messages;
}

static void *rr_echo_thread_uring(void *arg) {
    struct uring_echo *u = arg;
    struct io_uring ring;
    uring_init(&ring);
    struct io_uring_sqe *e = sqe_of(&ring);
    io_uring_prep_read(e, u->newfd[0], &u->incoming, sizeof u->incoming, 0);
    io_uring_sqe_set_data64(e, ud(u->newfd[0], OP_NEWFD, 0));
    for (;;) {
        io_uring_submit_and_wait(&ring, 1);
        uring_reap(&ring, rr_req, rr_resp, u);
    }
    return NULL;
}

static void tcp_rr_echo_uring(int l, int threads) {
    static struct uring_echo us[RR_MAX_THREADS];
    uring_bufs_alloc();
    for (int t = 0; t < threads; t++) {
        pthread_t th;
        if (pipe(us[t].newfd) != 0)
            die("pipe");
        if (pthread_create(&th, NULL, rr_echo_thread_uring, &us[t]) != 0)
            die("pthread_create");
    }
    for (unsigned next = 0;; next++) {
        int c = rr_accept(l);
        if (write(us[next % (unsigned)threads].newfd[1], &c, sizeof c) != (ssize_t)sizeof c)
            die("write");
    }
}

static void rr_client_uring(struct rr_client *c) {
    struct io_uring ring;
    uring_init(&ring);
    for (int i = 0; i < c->nfds; i++) {
        int fd = c->fds[i];
        uring_send(&ring, fd, (uint64_t)c->depth * rr_req);
        uring_recv(&ring, fd, uring_bufs[fd]);
    }
    struct __kernel_timespec tick = {.tv_sec = 0, .tv_nsec = 10000000};
    uint64_t now;
    while ((now = now_ns()) < c->end) {
        struct io_uring_cqe *first;
        io_uring_submit_and_wait_timeout(&ring, &first, 1, &tick, NULL);
        uint64_t done = uring_reap(&ring, rr_resp, rr_req, NULL);
        if (now >= c->warm_end)
            c->transactions += done;
    }
    io_uring_queue_exit(&ring);
}
#endif

static void *udp_rr_echo_thread(void *arg) {
    int fd = (int)(intptr_t)arg;
    static __thread char buf[MAX_MSG];
    for (;;) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t r = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (r < 0)
            continue;
        sendto(fd, rr_zeros, rr_resp, 0, (struct sockaddr *)&from, fl);
    }
    return NULL;
}

/* The echo's sockets share the port (SO_REUSEPORT); a classic BPF program on the group picks a
 * datagram's socket by its first payload word modulo THREADS (a request shorter than four bytes
 * falls back to the kernel's hash). The client writes its thread's number there, so client
 * thread t talks to echo thread t only and the pair wakes each other on one CPU, as the TCP
 * floor's dealt connections do. */
static void udp_rr_echo(int port, int threads) {
    for (int t = 0; t < threads; t++) {
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        struct sockaddr_in a = addr_of("127.0.0.1", port);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0)
            die("bind");
        if (t == 0) {
            struct sock_filter code[] = {
                {BPF_LD | BPF_W | BPF_ABS, 0, 0, 0},
                {BPF_ALU | BPF_MOD | BPF_K, 0, 0, (uint32_t)threads},
                {BPF_RET | BPF_A, 0, 0, 0},
            };
            struct sock_fprog prog = {.len = 3, .filter = code};
            if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0)
                die("SO_ATTACH_REUSEPORT_CBPF");
        }
        pthread_t th;
        if (pthread_create(&th, NULL, udp_rr_echo_thread, (void *)(intptr_t)fd) != 0)
            die("pthread_create");
    }
    for (;;)
        pause();
}

static void *udp_rr_client_thread(void *arg) {
    struct rr_client *c = arg;
    static __thread char buf[MAX_MSG];
    if (c->nfds == 1) {
        rr_one_flow(c, 0, buf, sizeof buf);
        return NULL;
    }
    int ep = epoll_create1(0);
    if (ep < 0)
        die("epoll_create1");
    for (int i = 0; i < c->nfds; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = c->fds[i]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fds[i], &ev) != 0)
            die("epoll_ctl");
        for (int d = 0; d < c->depth; d++)
            send(c->fds[i], c->req, rr_req, 0);
    }
    struct epoll_event evs[256];
    uint64_t now;
    while ((now = now_ns()) < c->end) {
        int n = epoll_wait(ep, evs, 256, 10);
        /* At most DEPTH datagrams per ready flow and wake-up (a flow has no more in flight):
         * at depth 1 one recv, not a second that would find nothing (one more system call per
         * transaction); a flow left with some queued is still ready at the next epoll_wait. */
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            for (int k = 0; k < c->depth; k++) {
                if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) <= 0)
                    break;
                if (now >= c->warm_end)
                    c->transactions++;
                send(fd, c->req, rr_req, 0);
            }
        }
    }
    close(ep);
    return NULL;
}

static void udp_rr(const char *host, int port, int flows, int depth, int threads, double secs,
                   double warm) {
    if (threads > flows)
        threads = flows;
    int *fds = calloc((size_t)flows, sizeof *fds);
    if (!fds)
        die("calloc");
    for (int i = 0; i < flows; i++)
        fds[i] = connected(SOCK_DGRAM, host, port);
    int *ord = calloc((size_t)flows, sizeof *ord);
    int starts[RR_MAX_THREADS + 1];
    if (!ord)
        die("calloc");
    interleave(fds, flows, threads, ord, starts);
    uint64_t start = now_ns();
    static struct rr_client cs[RR_MAX_THREADS];
    pthread_t ths[RR_MAX_THREADS];
    for (int t = 0; t < threads; t++) {
        cs[t] = (struct rr_client){
            .fds = ord + starts[t],
            .nfds = starts[t + 1] - starts[t],
            .depth = depth,
            .warm_end = start + (uint64_t)(warm * 1e9),
            .end = start + (uint64_t)((warm + secs) * 1e9),
        };
        uint32_t id = htonl((uint32_t)t);
        memcpy(cs[t].req, &id, sizeof id);
        if (pthread_create(&ths[t], NULL, udp_rr_client_thread, &cs[t]) != 0)
            die("pthread_create");
    }
    uint64_t total = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(ths[t], NULL);
        total += cs[t].transactions;
    }
    for (int i = 0; i < flows; i++)
        close(fds[i]);
    free(fds);
    free(ord);
    printf("{\"tps\": %.1f, \"transactions\": %llu, \"seconds\": %.3f}\n", (double)total / secs,
           (unsigned long long)total, secs);
}

/* ---- mesh: the mesh agent's probe work and nothing else (bench/mesh_budget.py --floor) ----
 *
 * One thread, one epoll loop. Probing: N peers at 127.1.0.1 upwards (as mesh_budget.py's
 * peer_addr), port -P, one UDP probe and one TCP probe per peer per interval (-i ms), each
 * interval drawn in interval +- 10% and the first at a random point of the first, as sonde's
 * prober; UDP from a pool of 64 source ports in rotation, each probe a sendto, each reply a
 * recvfrom (its first 8 bytes say whose probe it was); TCP a non-blocking connect registered
 * once (edge-triggered, in and out), one write when connected, one read of the reply, close.
 * The timer is coalesced: the loop wakes at most every -k ms for the probes due (every probe
 * due is sent then, its send time read from the clock as it goes). Answering, on PORT (both
 * protocols; --any binds 0.0.0.0, else 127.0.0.1): each datagram echoed at once (recvfrom +
 * sendto until the socket is empty), each connection accepted non-blocking, its probe read and
 * echoed, then closed. No MACs, no statistics beyond counts. -N 0: answering only (the floor's
 * responder). Bounded by -t seconds; prints counts as one JSON line at the end. */

#define MESH_PORTS 64
#define MESH_MAX_PEERS 65024
#define MESH_MAX_CONNS 65536
#define MESH_MAX_SECS 3600
#define MESH_PROBE 64

struct mesh_conn {
    int fd;            /* -1: free */
    int answering;     /* 1: an incoming connection waiting for its probe */
    uint32_t peer;
    uint64_t seq;
    uint64_t started;
    uint64_t written;
};

static struct mesh_conn mesh_conns[MESH_MAX_CONNS];
static int mesh_free[MESH_MAX_CONNS];
static int mesh_nfree;

/* A min-heap of (due ns, key): key = peer * 2 + (1 for TCP). */
struct mesh_due {
    uint64_t due;
    uint32_t key;
};
static struct mesh_due *mesh_heap;
static size_t mesh_heap_len;

static void heap_push(uint64_t due, uint32_t key) {
    size_t i = mesh_heap_len++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (mesh_heap[p].due <= due)
            break;
        mesh_heap[i] = mesh_heap[p];
        i = p;
    }
    mesh_heap[i].due = due;
    mesh_heap[i].key = key;
}

static struct mesh_due heap_pop(void) {
    struct mesh_due top = mesh_heap[0], last = mesh_heap[--mesh_heap_len];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= mesh_heap_len)
            break;
        if (c + 1 < mesh_heap_len && mesh_heap[c + 1].due < mesh_heap[c].due)
            c++;
        if (last.due <= mesh_heap[c].due)
            break;
        mesh_heap[i] = mesh_heap[c];
        i = c;
    }
    if (mesh_heap_len > 0)
        mesh_heap[i] = last;
    return top;
}

static uint64_t mesh_rng = 0x9e3779b97f4a7c15ULL;
static uint64_t mesh_rand(void) { /* SplitMix64, as sonde's prober */
    uint64_t z = (mesh_rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* epoll data: the UDP pool sockets 0..63, the answering UDP socket and listener, then
 * connections from MESH_CONN_TAG up. */
#define MESH_TAG_UDP_IN 100
#define MESH_TAG_LISTEN 101
#define MESH_CONN_TAG 1000

static int mesh_conn_new(void) {
    if (mesh_nfree == 0)
        return -1;
    return mesh_free[--mesh_nfree];
}

static void mesh_conn_close(int c) {
    close(mesh_conns[c].fd);
    mesh_conns[c].fd = -1;
    mesh_free[mesh_nfree++] = c;
}

static volatile sig_atomic_t mesh_stop;
static void mesh_on_signal(int sig) {
    (void)sig;
    mesh_stop = 1;
}

static void mesh(int port, int any, uint32_t peers, int peer_port, double interval_ms,
                 double tick_ms, double secs) {
    static char probe[MESH_PROBE], buf[2048];
    int ep = epoll_create1(0);
    if (ep < 0)
        die("epoll_create1");
    struct epoll_event ev;
    /* SIGINT or SIGTERM: the counts so far, printed. */
    signal(SIGINT, mesh_on_signal);
    signal(SIGTERM, mesh_on_signal);
    for (int i = MESH_MAX_CONNS - 1; i >= 0; i--) {
        mesh_conns[i].fd = -1;
        mesh_free[mesh_nfree++] = i;
    }
    /* Answering. */
    struct sockaddr_in me = addr_of(any ? "0.0.0.0" : "127.0.0.1", port);
    int one = 1;
    int uin = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int lis = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (uin < 0 || lis < 0)
        die("socket");
    setsockopt(lis, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(uin, (struct sockaddr *)&me, sizeof me) != 0 ||
        bind(lis, (struct sockaddr *)&me, sizeof me) != 0 || listen(lis, 4096) != 0)
        die("bind");
    ev.events = EPOLLIN;
    ev.data.u64 = MESH_TAG_UDP_IN;
    epoll_ctl(ep, EPOLL_CTL_ADD, uin, &ev);
    ev.data.u64 = MESH_TAG_LISTEN;
    epoll_ctl(ep, EPOLL_CTL_ADD, lis, &ev);
    /* Probing. */
    int pool[MESH_PORTS];
    for (int i = 0; i < MESH_PORTS; i++) {
        pool[i] = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (pool[i] < 0)
            die("socket");
        ev.events = EPOLLIN;
        ev.data.u64 = (uint64_t)i;
        epoll_ctl(ep, EPOLL_CTL_ADD, pool[i], &ev);
    }
    uint64_t *sent_ns = calloc(peers ? peers : 1, sizeof *sent_ns);
    uint64_t *seqs = calloc(peers ? peers * 2 : 1, sizeof *seqs);
    mesh_heap = calloc(peers ? peers * 2 : 1, sizeof *mesh_heap);
    if (!sent_ns || !seqs || !mesh_heap)
        die("calloc");
    mesh_rng ^= now_ns() ^ ((uint64_t)getpid() << 32);
    uint64_t interval = (uint64_t)(interval_ms * 1e6), jitter = interval / 10;
    uint64_t tick = (uint64_t)(tick_ms * 1e6);
    if (tick < 1000000)
        tick = 1000000;
    uint64_t start = now_ns(), end = start + (uint64_t)(secs * 1e9);
    for (uint32_t k = 0; k < peers * 2; k++)
        heap_push(start + mesh_rand() % interval, k);
    unsigned long long udp_sent = 0, udp_answered = 0, tcp_sent = 0, tcp_answered = 0;
    unsigned long long udp_in = 0, tcp_in = 0, failed = 0;
    uint64_t rtt_sum = 0;
    uint32_t rot = 0;
    uint64_t last_sweep = start;
    struct epoll_event evs[256];
    for (;;) {
        uint64_t now = now_ns();
        if (now >= end || mesh_stop)
            break;
        /* Every probe due by now (the timer's tick passed). */
        while (mesh_heap_len > 0 && mesh_heap[0].due <= now) {
            struct mesh_due d = heap_pop();
            uint32_t peer = d.key / 2;
            int tcp = d.key & 1;
            uint64_t seq = seqs[d.key]++;
            uint64_t next = d.due + interval - jitter + mesh_rand() % (2 * jitter + 1);
            heap_push(next > now ? next : now + interval, d.key);
            struct sockaddr_in to;
            memset(&to, 0, sizeof to);
            to.sin_family = AF_INET;
            to.sin_port = htons((uint16_t)peer_port);
            to.sin_addr.s_addr = htonl((127u << 24) | (1u << 16) | ((peer / 254) << 8) | (peer % 254 + 1));
            memcpy(probe, &peer, 4);
            memcpy(probe + 4, &seq, 4);
            if (!tcp) {
                sent_ns[peer] = now_ns();
                if (sendto(pool[rot++ % MESH_PORTS], probe, MESH_PROBE, 0, (struct sockaddr *)&to, sizeof to) == MESH_PROBE)
                    udp_sent++;
                else
                    failed++;
                continue;
            }
            int c = mesh_conn_new();
            if (c < 0) {
                failed++;
                continue;
            }
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
            if (fd < 0) {
                mesh_free[mesh_nfree++] = c;
                failed++;
                continue;
            }
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            struct mesh_conn *m = &mesh_conns[c];
            m->fd = fd;
            m->answering = 0;
            m->peer = peer;
            m->seq = seq;
            m->written = 0;
            m->started = now_ns();
            if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0 && errno != EINPROGRESS) {
                mesh_conn_close(c);
                failed++;
                continue;
            }
            ev.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
            ev.data.u64 = MESH_CONN_TAG + (uint64_t)c;
            epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
            tcp_sent++;
        }
        /* Connections older than 2 s: given up (once a second). */
        if (now - last_sweep > 1000000000ULL) {
            last_sweep = now;
            for (int c = 0; c < MESH_MAX_CONNS; c++)
                if (mesh_conns[c].fd >= 0 && now - mesh_conns[c].started > 2000000000ULL)
                    mesh_conn_close(c);
        }
        /* Sleep to the tick after the next probe due (coalesced), or a second. */
        uint64_t wake = mesh_heap_len > 0 ? mesh_heap[0].due : now + 1000000000ULL;
        wake = (wake + tick - 1) / tick * tick;
        if (wake > end)
            wake = end;
        int timeout = wake > now ? (int)((wake - now + 999999) / 1000000) : 0;
        int n = epoll_wait(ep, evs, 256, timeout);
        for (int i = 0; i < n; i++) {
            uint64_t tag = evs[i].data.u64;
            if (tag < MESH_PORTS) {
                for (;;) {
                    ssize_t r = recv(pool[tag], buf, sizeof buf, 0);
                    if (r < 0)
                        break;
                    uint32_t peer;
                    memcpy(&peer, buf, 4);
                    if (r >= 8 && peer < peers) {
                        rtt_sum += now_ns() - sent_ns[peer];
                        udp_answered++;
                    }
                }
            } else if (tag == MESH_TAG_UDP_IN) {
                for (;;) {
                    struct sockaddr_in from;
                    socklen_t fl = sizeof from;
                    ssize_t r = recvfrom(uin, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
                    if (r < 0)
                        break;
                    sendto(uin, buf, (size_t)r, 0, (struct sockaddr *)&from, fl);
                    udp_in++;
                }
            } else if (tag == MESH_TAG_LISTEN) {
                for (;;) {
                    int fd = accept4(lis, NULL, NULL, SOCK_NONBLOCK);
                    if (fd < 0)
                        break;
                    ssize_t r = read(fd, buf, sizeof buf);
                    if (r > 0) {
                        (void)!write(fd, buf, (size_t)r);
                        close(fd);
                        tcp_in++;
                        continue;
                    }
                    int c = r < 0 && errno == EAGAIN ? mesh_conn_new() : -1;
                    if (c < 0) {
                        close(fd);
                        continue;
                    }
                    mesh_conns[c].fd = fd;
                    mesh_conns[c].answering = 1;
                    mesh_conns[c].started = now_ns();
                    ev.events = EPOLLIN | EPOLLET;
                    ev.data.u64 = MESH_CONN_TAG + (uint64_t)c;
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                }
            } else {
                int c = (int)(tag - MESH_CONN_TAG);
                struct mesh_conn *m = &mesh_conns[c];
                if (m->fd < 0)
                    continue;
                if (m->answering) {
                    ssize_t r = read(m->fd, buf, sizeof buf);
                    if (r > 0) {
                        (void)!write(m->fd, buf, (size_t)r);
                        tcp_in++;
                    }
                    if (r >= 0 || errno != EAGAIN)
                        mesh_conn_close(c);
                    continue;
                }
                if (evs[i].events & (EPOLLERR | EPOLLHUP) && !m->written) {
                    failed++;
                    mesh_conn_close(c);
                    continue;
                }
                if (!m->written && (evs[i].events & EPOLLOUT)) {
                    memcpy(probe, &m->peer, 4);
                    memcpy(probe + 4, &m->seq, 4);
                    if (write(m->fd, probe, MESH_PROBE) != MESH_PROBE) {
                        failed++;
                        mesh_conn_close(c);
                        continue;
                    }
                    m->written = now_ns();
                }
                if (m->written && (evs[i].events & (EPOLLIN | EPOLLRDHUP))) {
                    ssize_t r = read(m->fd, buf, sizeof buf);
                    if (r < 0 && errno == EAGAIN)
                        continue;
                    if (r >= 8) {
                        rtt_sum += now_ns() - m->written;
                        tcp_answered++;
                    }
                    mesh_conn_close(c);
                }
            }
        }
    }
    unsigned long long answered = udp_answered + tcp_answered;
    printf("{\"udp_sent\": %llu, \"udp_answered\": %llu, \"tcp_sent\": %llu, \"tcp_answered\": %llu, "
           "\"udp_in\": %llu, \"tcp_in\": %llu, \"failed\": %llu, \"mean_rtt_ns\": %llu, \"seconds\": %.3f}\n",
           udp_sent, udp_answered, tcp_sent, tcp_answered, udp_in, tcp_in, failed,
           answered ? (unsigned long long)(rtt_sum / answered) : 0ULL, (double)(now_ns() - start) / 1e9);
}

static void usage(void) {
    fprintf(stderr, "usage: see the comment at the top of bench/floor/floor.c\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "has-uring")) /* exit status 0: built with --uring */
#ifdef HAVE_URING
        return 0;
#else
        return 1;
#endif
    if (argc < 3)
        usage();
    const char *mode = argv[1];
    int client = strstr(mode, "ping") || !strcmp(mode, "tcp-stream") || !strcmp(mode, "udp-blast") ||
                 !strcmp(mode, "tcp-rr") || !strcmp(mode, "udp-rr");
    const char *host = client ? argv[2] : "127.0.0.1";
    int first_opt = client ? 4 : 3;
    if (argc < first_opt)
        usage();
    int port = atoi(argv[first_opt - 1]);
    size_t size = 64, len = 128 * 1024, rsize = SINK_BUF;
    double secs = 5, warm = 1;
    int cpu = -1, flows = 1, depth = 1, threads = 1;
    size_t resp = 0;
    int any = 0, mesh_peer_port = 0;
    long mesh_peers = 0;
    double interval_ms = 10000, tick_ms = 5;
    for (int i = first_opt; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--busy"))
            busy = 1;
        else if (!strcmp(a, "--uring"))
#ifdef HAVE_URING
            uring = 1;
#else
            (fprintf(stderr, "floor: built without liburing (install liburing-dev)\n"), exit(2));
#endif
        else if (!strcmp(a, "--cpu") && v)
            cpu = atoi(v), i++;
        else if (!strcmp(a, "-m") && v)
            size = (size_t)atol(v), i++;
        else if (!strcmp(a, "-l") && v)
            len = (size_t)atol(v), i++;
        else if (!strcmp(a, "-r") && v)
            rsize = (size_t)atol(v), i++;
        else if (!strcmp(a, "-t") && v)
            secs = atof(v), i++;
        else if (!strcmp(a, "-w") && v)
            warm = atof(v), i++;
        else if (!strcmp(a, "-F") && v)
            flows = atoi(v), i++;
        else if (!strcmp(a, "-D") && v)
            depth = atoi(v), i++;
        else if (!strcmp(a, "-T") && v)
            threads = atoi(v), i++;
        else if (!strcmp(a, "-R") && v)
            resp = (size_t)atol(v), i++;
        else if (!strcmp(a, "--any"))
            any = 1;
        else if (!strcmp(a, "-N") && v)
            mesh_peers = atol(v), i++;
        else if (!strcmp(a, "-P") && v)
            mesh_peer_port = atoi(v), i++;
        else if (!strcmp(a, "-i") && v)
            interval_ms = atof(v), i++;
        else if (!strcmp(a, "-k") && v)
            tick_ms = atof(v), i++;
        else
            usage();
    }
    if (!strcmp(mode, "mesh")) {
        if (mesh_peers < 0 || mesh_peers > MESH_MAX_PEERS || (mesh_peers > 0 && mesh_peer_port <= 0) ||
            interval_ms < 10 || tick_ms < 1 || tick_ms > 1000 || secs <= 0 || secs > MESH_MAX_SECS)
            usage();
        mesh(port, any, (uint32_t)mesh_peers, mesh_peer_port, interval_ms, tick_ms, secs);
        return 0;
    }
    if (rsize < 1 || rsize > SINK_BUF)
        usage();
    if (size < 1 || size > MAX_MSG || secs <= 0 || secs > MAX_SECS || warm < 0 || warm > MAX_SECS)
        usage();
    if (flows < 1 || flows > 60000 || depth < 1 || depth > 1024 || threads < 1 ||
        threads > RR_MAX_THREADS || resp > MAX_MSG)
        usage();
    rr_req = size;
    rr_resp = resp ? resp : size;
    pin(cpu);
    if (!strcmp(mode, "tcp-rr-echo"))
        tcp_rr_echo(port, threads);
    else if (!strcmp(mode, "udp-rr-echo"))
        udp_rr_echo(port, threads);
    else if (!strcmp(mode, "udp-rr"))
        udp_rr(host, port, flows, depth, threads, secs, warm);
    else if (!strcmp(mode, "tcp-rr"))
        tcp_rr(host, port, flows, depth, threads, secs, warm);
    else if (!strcmp(mode, "udp-echo"))
        udp_echo(port);
    else if (!strcmp(mode, "tcp-echo"))
        tcp_echo(port);
    else if (!strcmp(mode, "udp-ping"))
        ping(0, host, port, size, secs, warm);
    else if (!strcmp(mode, "tcp-ping"))
        ping(1, host, port, size, secs, warm);
    else if (!strcmp(mode, "tcp-sink"))
        tcp_sink(port, rsize);
    else if (!strcmp(mode, "tcp-stream"))
        tcp_stream(host, port, secs, len);
    else if (!strcmp(mode, "udp-sink"))
        udp_sink(port);
    else if (!strcmp(mode, "udp-blast"))
        udp_blast(host, port, size, secs);
    else
        usage();
    return 0;
}
