/* An ordinary rdma-core application, compiled against Debian's own headers
 * and run on softrdma's libibverbs/librdmacm by tests/dropin.rs
 * (`softrdma run -- verbs_check MODE`). It checks the data it moves and
 * the errors misuse gets, and exits 0 only if all was as expected.
 *
 *   verbs_check server PORT [SHARE]  accept one connection, serve it
 *   verbs_check client HOST PORT [SHARE]
 *                                    Write, Read back, Send; check bytes.
 *                                    Both print which mapping holds their
 *                                    registered buffer; SHARE is share
 *                                    (SOFTRDMA_SHARE_MR=1, the default),
 *                                    share-threaded (and a second thread)
 *                                    or private (SOFTRDMA_SHARE_MR=0)
 *   verbs_check misuse CASE          one misuse on a connected pair in
 *                                    this process: reset-post, sge-bounds,
 *                                    dereg, destroy-busy, cq-overrun; or
 *                                    destroy-unacked (librdmacm's
 *                                    rdma_destroy_id waits until the
 *                                    id's events are acknowledged)
 *   verbs_check notify CASE          completion events on a connected
 *                                    pair: next-only (a notification
 *                                    requested with completions already
 *                                    queued fires for the next one only)
 *                                    or stop-continue (a wait in
 *                                    ibv_get_cq_event survives SIGSTOP and
 *                                    SIGCONT) or spin-then-stop (a
 *                                    spinning poller's QPs go back to
 *                                    the progress threads when it stops)
 *                                    or held-write (a post held for a
 *                                    poll that never comes still goes)
 *                                    or idle-spin (a thread spinning on
 *                                    a CQ that gets nothing waits for
 *                                    input in the kernel, and a Send
 *                                    that then comes completes)
 *
 * The server's buffer starts as a pattern the client knows; the client
 * writes another pattern, reads it back, and sends a message whose bytes
 * the server checks. Any mismatch prints "MISMATCH" and exits 1.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define BUF (1 << 20)
#define MSG 4096

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno)); exit(2); } while (0)

struct ad { uint64_t addr; uint32_t rkey; uint32_t len; };

struct end {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		DIE("rdma_get_cm_event");
	if (e->event != want) {
		fprintf(stderr, "got %s (status %d), wanted %s\n", rdma_event_str(e->event), e->status,
			rdma_event_str(want));
		exit(2);
	}
	return e;
}

static unsigned char pat(size_t i, int seed);
static int check(const char *what, const char *b, size_t n, int seed);

/* Which mapping holds p: "memfd" when softrdma moved it into its file
 * (SOFTRDMA_SHARE_MR, on by default), else "private". */
static const char *mapping_of(const void *p)
{
	char line[512];
	const char *kind = "unmapped";
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		return "unknown";
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)p >= lo && (uintptr_t)p < hi) {
			kind = strstr(line, "memfd:softrdma-mr") ? "memfd" : "private";
			break;
		}
	}
	fclose(f);
	return kind;
}

static void *idle_thread(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

/* The optional last argument of server and client: "share" asks softrdma
 * to move registered pages into its file (SOFTRDMA_SHARE_MR=1, read at the
 * first registration; the default); "share-threaded" too, with a second
 * application thread alive, where nothing may move; "private" turns it off
 * (SOFTRDMA_SHARE_MR=0). */
static int share_opt(const char *opt)
{
	pthread_t t;
	if (!opt)
		return 0;
	if (strcmp(opt, "share") && strcmp(opt, "share-threaded") && strcmp(opt, "private")) {
		fprintf(stderr, "unknown option %s\n", opt);
		return 2;
	}
	setenv("SOFTRDMA_SHARE_MR", strcmp(opt, "private") ? "1" : "0", 1);
	if (!strcmp(opt, "share-threaded") && pthread_create(&t, NULL, idle_thread, NULL))
		DIE("pthread_create");
	return 0;
}

static void setup(struct end *x, struct rdma_cm_id *id, int cqe)
{
	struct ibv_qp_init_attr a;
	x->id = id;
	x->pd = ibv_alloc_pd(id->verbs);
	x->ch = ibv_create_comp_channel(id->verbs);
	x->cq = x->ch ? ibv_create_cq(id->verbs, cqe, NULL, x->ch, 0) : NULL;
	if (!x->pd || !x->cq)
		DIE("pd/cq");
	x->buf = aligned_alloc(4096, BUF);
	/* Bytes written before the registration are there after it. */
	for (size_t i = 0; i < BUF; i++)
		x->buf[i] = pat(i, 7);
	x->mr = ibv_reg_mr(x->pd, x->buf, BUF,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	if (!x->mr)
		DIE("ibv_reg_mr");
	if (check("bytes kept by the registration", x->buf, BUF, 7))
		exit(1);
	printf("buffer: %s\n", mapping_of(x->buf));
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = x->cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 64;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, x->pd, &a))
		DIE("rdma_create_qp");
}

static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	double end = now() + 10;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		if (now() > end) {
			fprintf(stderr, "no completion in 10 s\n");
			exit(2);
		}
	if (n < 0)
		DIE("ibv_poll_cq");
	return wc;
}

static void post(struct end *x, enum ibv_wr_opcode op, uint32_t off, uint32_t len, struct ad *r, uint32_t roff)
{
	struct ibv_sge s = { (uintptr_t)x->buf + off, len, x->mr->lkey };
	struct ibv_send_wr w, *bad;
	memset(&w, 0, sizeof(w));
	w.wr_id = op;
	w.sg_list = &s;
	w.num_sge = 1;
	w.opcode = op;
	w.send_flags = IBV_SEND_SIGNALED;
	if (r) {
		w.wr.rdma.remote_addr = r->addr + roff;
		w.wr.rdma.rkey = r->rkey;
	}
	if (ibv_post_send(x->id->qp, &w, &bad))
		DIE("ibv_post_send");
}

static void post_recv(struct end *x, uint32_t off, uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)x->buf + off, len, x->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = 7, .sg_list = &s, .num_sge = 1 }, *bad;
	if (ibv_post_recv(x->id->qp, &w, &bad))
		DIE("ibv_post_recv");
}

static unsigned char pat(size_t i, int seed) { return (unsigned char)(i * 131 + seed * 7 + (i >> 9)); }

static int check(const char *what, const char *b, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)b[i] != pat(i, seed)) {
			printf("MISMATCH in %s at byte %zu: %u, wanted %u\n", what, i, (unsigned char)b[i], pat(i, seed));
			return 1;
		}
	return 0;
}

static int server(const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(port)) };
	struct rdma_cm_event *e;
	struct end x;
	struct ad me;
	struct rdma_conn_param p;
	struct ibv_wc wc;
	int bad = 0;

	if (!ch || rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) || rdma_bind_addr(l, (struct sockaddr *)&a) ||
	    rdma_listen(l, 1))
		DIE("listen");
	printf("listening\n");
	fflush(stdout);
	e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	setup(&x, e->id, 64);
	rdma_ack_cm_event(e);
	for (size_t i = 0; i < BUF; i++)
		x.buf[i] = pat(i, 1);
	post_recv(&x, BUF - MSG, MSG);
	me.addr = (uintptr_t)x.buf;
	me.rkey = x.mr->rkey;
	me.len = BUF;
	memset(&p, 0, sizeof(p));
	p.private_data = &me;
	p.private_data_len = sizeof(me);
	p.responder_resources = p.initiator_depth = 4;
	if (rdma_accept(x.id, &p))
		DIE("rdma_accept");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	wc = wait_wc(x.cq);
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != MSG) {
		printf("bad receive: status %s opcode %d len %u\n", ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len);
		return 1;
	}
	/* The client wrote pattern 2 over the first BUF - MSG bytes, then sent pattern 3. */
	bad |= check("written data", x.buf, BUF - MSG, 2);
	bad |= check("sent data", x.buf + BUF - MSG, MSG, 3);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	printf(bad ? "server: data WRONG\n" : "server: data ok\n");
	return bad;
}

static int client(const char *host, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	struct addrinfo *ai;
	struct rdma_cm_event *e;
	struct rdma_conn_param p;
	struct end x;
	struct ad peer;
	struct ibv_wc wc;
	int bad = 0;

	if (getaddrinfo(host, port, NULL, &ai))
		DIE("getaddrinfo");
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_resolve_addr(id, NULL, ai->ai_addr, 2000))
		DIE("resolve");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		DIE("route");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	setup(&x, id, 64);
	printf("device %s\n", ibv_get_device_name(id->verbs->device));
	memset(&p, 0, sizeof(p));
	p.responder_resources = p.initiator_depth = 4;
	if (rdma_connect(id, &p))
		DIE("rdma_connect");
	e = expect(ch, RDMA_CM_EVENT_ESTABLISHED);
	if (e->param.conn.private_data_len < sizeof(peer)) {
		printf("no advertisement in the private data (%u bytes)\n", e->param.conn.private_data_len);
		return 1;
	}
	memcpy(&peer, e->param.conn.private_data, sizeof(peer));
	rdma_ack_cm_event(e);
	/* Read the server's initial pattern. */
	post(&x, IBV_WR_RDMA_READ, 0, BUF - MSG, &peer, 0);
	wc = wait_wc(x.cq);
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RDMA_READ) {
		printf("read failed: %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	bad |= check("read data", x.buf, BUF - MSG, 1);
	/* Write pattern 2, read it back into the second half of our buffer... */
	for (size_t i = 0; i < BUF - MSG; i++)
		x.buf[i] = pat(i, 2);
	post(&x, IBV_WR_RDMA_WRITE, 0, BUF - MSG, &peer, 0);
	if ((wc = wait_wc(x.cq)).status != IBV_WC_SUCCESS) {
		printf("write failed: %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	memset(x.buf, 0, BUF);
	post(&x, IBV_WR_RDMA_READ, 0, BUF - MSG, &peer, 0);
	if ((wc = wait_wc(x.cq)).status != IBV_WC_SUCCESS) {
		printf("read back failed: %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	bad |= check("data read back", x.buf, BUF - MSG, 2);
	/* ... and send pattern 3. */
	for (size_t i = 0; i < MSG; i++)
		x.buf[i] = pat(i, 3);
	post(&x, IBV_WR_SEND, 0, MSG, NULL, 0);
	if ((wc = wait_wc(x.cq)).status != IBV_WC_SUCCESS) {
		printf("send failed: %s\n", ibv_wc_status_str(wc.status));
		return 1;
	}
	rdma_disconnect(id);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	printf(bad ? "client: data WRONG\n" : "client: data ok\n");
	return bad;
}

/* A connected pair in this process: a listening id and a connecting one on
 * one channel (the library connects on threads of its own). */
static void pair(struct end *c, struct end *s, int cqe)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *l, *id;
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct rdma_cm_event *e;
	struct rdma_conn_param p;
	int up = 0;

	if (!ch || rdma_create_id(ch, &l, NULL, RDMA_PS_TCP) || rdma_bind_addr(l, (struct sockaddr *)&a) ||
	    rdma_listen(l, 1))
		DIE("listen");
	a.sin_port = rdma_get_src_port(l);
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) || rdma_resolve_addr(id, NULL, (struct sockaddr *)&a, 2000))
		DIE("resolve");
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	rdma_resolve_route(id, 2000);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	setup(c, id, cqe);
	memset(&p, 0, sizeof(p));
	p.responder_resources = p.initiator_depth = 4;
	if (rdma_connect(id, &p))
		DIE("rdma_connect");
	e = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	setup(s, e->id, 64);
	rdma_ack_cm_event(e);
	if (rdma_accept(s->id, &p))
		DIE("rdma_accept");
	while (up < 2) {
		rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
		up++;
	}
}

/* destroy-unacked: a CM thread, as rping has, holds DISCONNECTED while the
 * main thread destroys the id; it reads the event's id after a while, then
 * acknowledges. */
struct holder {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	volatile int got;
	void *context;
	double acked;
};

static void *hold_event(void *arg)
{
	struct holder *h = arg;
	struct rdma_cm_event *e;
	/* The channel also carries the accepting side's DISCONNECTED. */
	while ((e = expect(h->ch, RDMA_CM_EVENT_DISCONNECTED))->id != h->id)
		rdma_ack_cm_event(e);
	h->got = 1;
	usleep(300 * 1000);
	h->context = e->id->context;
	h->acked = now();
	rdma_ack_cm_event(e);
	return NULL;
}

static int misuse(const char *what)
{
	struct end c, s;
	struct ibv_send_wr w, *bad = NULL;
	struct ibv_sge sge;
	struct ibv_wc wc;
	int r;

	if (!strcmp(what, "reset-post")) {
		/* A QP that never left RESET: the post fails, nothing is sent. */
		struct ibv_device **l = ibv_get_device_list(NULL);
		struct ibv_context *ctx = ibv_open_device(l[0]);
		struct ibv_pd *pd = ibv_alloc_pd(ctx);
		struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
		char *b = malloc(64);
		struct ibv_mr *mr = ibv_reg_mr(pd, b, 64, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
					      .cap = { 8, 8, 1, 1, 0 } };
		struct ibv_qp *qp = ibv_create_qp(pd, &a);
		if (!qp || !mr)
			DIE("qp");
		sge = (struct ibv_sge){ (uintptr_t)b, 64, mr->lkey };
		memset(&w, 0, sizeof(w));
		w.sg_list = &sge;
		w.num_sge = 1;
		w.opcode = IBV_WR_SEND;
		r = ibv_post_send(qp, &w, &bad);
		printf("post on RESET: %d (%s), bad_wr %s\n", r, strerror(r), bad == &w ? "set" : "NOT SET");
		r = (r == EINVAL && bad == &w) ? 0 : 1;
		ibv_destroy_qp(qp);
		ibv_dereg_mr(mr);
		ibv_destroy_cq(cq);
		ibv_dealloc_pd(pd);
		ibv_close_device(ctx);
		ibv_free_device_list(l);
		return r;
	}
	if (!strcmp(what, "sge-bounds") || !strcmp(what, "dereg")) {
		pair(&c, &s, 64);
		sge = (struct ibv_sge){ (uintptr_t)c.buf + BUF - 16, 32, c.mr->lkey };
		if (!strcmp(what, "dereg")) {
			uint32_t lkey = c.mr->lkey;
			if (ibv_dereg_mr(c.mr))
				DIE("dereg");
			sge = (struct ibv_sge){ (uintptr_t)c.buf, 32, lkey };
		}
		memset(&w, 0, sizeof(w));
		w.sg_list = &sge;
		w.num_sge = 1;
		w.opcode = IBV_WR_RDMA_WRITE;
		w.send_flags = IBV_SEND_SIGNALED;
		w.wr.rdma.remote_addr = (uintptr_t)s.buf;
		w.wr.rdma.rkey = s.mr->rkey;
		memset(s.buf, 0x5a, 64);
		r = ibv_post_send(c.id->qp, &w, &bad);
		if (r == 0) {
			wc = wait_wc(c.cq);
			printf("%s: posted, completion %s\n", what, ibv_wc_status_str(wc.status));
			r = wc.status == IBV_WC_LOC_PROT_ERR ? 0 : 1;
		} else {
			printf("%s: post refused: %d (%s)\n", what, r, strerror(r));
			r = r == EINVAL ? 0 : 1;
		}
		for (int i = 0; i < 64; i++)
			if ((unsigned char)s.buf[i] != 0x5a) {
				printf("the target changed: byte %d\n", i);
				r = 1;
				break;
			}
		return r;
	}
	if (!strcmp(what, "destroy-busy")) {
		/* Destroying a QP with 32 MiB of Writes queued: no crash, the
		 * destroy returns 0, the rest of the process goes on. */
		pair(&c, &s, 64);
		for (int i = 0; i < 32; i++)
			post(&c, IBV_WR_RDMA_WRITE, 0, BUF, &(struct ad){ (uintptr_t)s.buf, s.mr->rkey, BUF }, 0);
		r = ibv_destroy_qp(c.id->qp);
		c.id->qp = NULL;
		printf("destroy with work in flight: %d\n", r);
		int n = 0, got;
		while ((got = ibv_poll_cq(c.cq, 1, &wc)) > 0)
			n++;
		printf("completions left after destroy: %d (poll %d)\n", n, got);
		if (ibv_dereg_mr(c.mr) || ibv_destroy_cq(c.cq))
			DIE("teardown after destroy");
		return r == 0 ? 0 : 1;
	}
	if (!strcmp(what, "cq-overrun")) {
		/* 16 signaled Writes into a CQ of 4: the CQ overruns; polling it
		 * reports an error and the context hears IBV_EVENT_CQ_ERR. */
		struct ibv_async_event ev;
		double end = now() + 10;
		int n = 0;
		pair(&c, &s, 4);
		for (int i = 0; i < 16; i++)
			post(&c, IBV_WR_RDMA_WRITE, 0, 8, &(struct ad){ (uintptr_t)s.buf, s.mr->rkey, BUF }, 0);
		for (;;) {
			r = ibv_poll_cq(c.cq, 1, &wc);
			if (r < 0)
				break;
			n += r;
			if (now() > end) {
				printf("no overrun reported after %d completions\n", n);
				return 1;
			}
		}
		printf("poll after overrun: %d, after %d completions\n", r, n);
		if (ibv_get_async_event(c.id->verbs, &ev))
			DIE("ibv_get_async_event");
		printf("async event: %s\n", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
		return ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == c.cq ? 0 : 1;
	}
	if (!strcmp(what, "destroy-unacked")) {
		struct holder h = { 0 };
		pthread_t t;
		double destroyed;
		int ours = 0x5eed;
		pair(&c, &s, 64);
		c.id->context = &ours;
		h.ch = c.id->channel;
		h.id = c.id;
		if (pthread_create(&t, NULL, hold_event, &h))
			DIE("pthread_create");
		if (rdma_disconnect(c.id))
			DIE("rdma_disconnect");
		while (!h.got)
			usleep(1000);
		rdma_destroy_qp(c.id);
		r = rdma_destroy_id(c.id);
		destroyed = now();
		pthread_join(t, NULL);
		printf("destroy: %d, %s the event was acknowledged; the event's id context %s\n", r,
		       destroyed >= h.acked ? "after" : "BEFORE", h.context == &ours ? "intact" : "LOST");
		return r == 0 && destroyed >= h.acked && h.context == &ours ? 0 : 1;
	}
	fprintf(stderr, "unknown case %s\n", what);
	return 2;
}

/* notify CASE: ibv_req_notify_cq and ibv_get_cq_event as the kernel's
 * providers (siw, rxe) give them. */
struct poster {
	struct end *c, *s;
	pid_t child;
};

static void *post_after_child(void *arg)
{
	struct poster *p = arg;
	int st;
	/* The child stops and continues this process, then exits: only then
	 * does the completion the main thread waits for come. */
	waitpid(p->child, &st, 0);
	post(p->c, IBV_WR_RDMA_WRITE, 0, 8, &(struct ad){ (uintptr_t)p->s->buf, p->s->mr->rkey, BUF }, 0);
	return NULL;
}

static char thread_state(pid_t pid)
{
	char path[64], buf[256], *q;
	FILE *f;
	snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", pid, pid);
	f = fopen(path, "r");
	if (!f)
		return '?';
	q = fgets(buf, sizeof(buf), f);
	fclose(f);
	q = q ? strrchr(buf, ')') : NULL;
	return q && q[1] == ' ' ? q[2] : '?';
}

static int notify(const char *what)
{
	struct end c, s;
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	struct ibv_wc wc[4];
	struct ad to;
	int r, n;

	pair(&c, &s, 64);
	to = (struct ad){ (uintptr_t)s.buf, s.mr->rkey, BUF };
	if (ibv_req_notify_cq(c.cq, 0))
		DIE("ibv_req_notify_cq");
	if (!strcmp(what, "next-only")) {
		/* One completion, its event taken: the completion stays queued. */
		post(&c, IBV_WR_RDMA_WRITE, 0, 8, &to, 0);
		if (ibv_get_cq_event(c.ch, &ev_cq, &ev_ctx))
			DIE("ibv_get_cq_event");
		ibv_ack_cq_events(ev_cq, 1);
		/* Armed again with it still queued: no event for it. */
		if (ibv_req_notify_cq(c.cq, 0))
			DIE("ibv_req_notify_cq");
		if (fcntl(c.ch->fd, F_SETFL, fcntl(c.ch->fd, F_GETFL) | O_NONBLOCK))
			DIE("fcntl");
		r = ibv_get_cq_event(c.ch, &ev_cq, &ev_ctx);
		printf("queued completion after arming: %s\n",
		       r == 0 ? "an event" : errno == EAGAIN ? "no event (EAGAIN)" : strerror(errno));
		if (r == 0)
			ibv_ack_cq_events(ev_cq, 1);
		/* The next completion fires it. */
		post(&c, IBV_WR_RDMA_WRITE, 0, 8, &to, 0);
		struct pollfd pf = { c.ch->fd, POLLIN, 0 };
		int ready = poll(&pf, 1, 10000);
		int r2 = ready == 1 ? ibv_get_cq_event(c.ch, &ev_cq, &ev_ctx) : -1;
		if (r2 == 0)
			ibv_ack_cq_events(ev_cq, 1);
		n = 0;
		for (double end = now() + 10; n < 2 && now() < end;) {
			int got = ibv_poll_cq(c.cq, 4, wc);
			if (got < 0)
				DIE("ibv_poll_cq");
			n += got;
		}
		printf("next completion: %s; completions polled: %d\n", r2 == 0 ? "an event" : "NO EVENT", n);
		return r != 0 && errno == EAGAIN && r2 == 0 && n == 2 ? 0 : 1;
	}
	if (!strcmp(what, "stop-continue")) {
		/* The main thread waits in ibv_get_cq_event; a child stops and
		 * continues this process; then a thread posts the Write that
		 * completes. The kernel's read() of a completion channel
		 * restarts after SIGSTOP/SIGCONT; the wait must go on too, not
		 * fail with EINTR. */
		struct poster p = { &c, &s, 0 };
		pthread_t t;
		pid_t parent = getpid();
		p.child = fork();
		if (p.child < 0)
			DIE("fork");
		if (p.child == 0) {
			double end = now() + 10;
			while (thread_state(parent) != 'S')
				if (now() > end)
					_exit(3);
			kill(parent, SIGSTOP);
			while (thread_state(parent) != 'T')
				if (now() > end)
					_exit(4);
			kill(parent, SIGCONT);
			_exit(0);
		}
		if (pthread_create(&t, NULL, post_after_child, &p))
			DIE("pthread_create");
		r = ibv_get_cq_event(c.ch, &ev_cq, &ev_ctx);
		printf("wait across SIGSTOP/SIGCONT: %s\n", r == 0 ? "the event" : strerror(errno));
		pthread_join(t, NULL);
		if (r == 0)
			ibv_ack_cq_events(ev_cq, 1);
		return r == 0 ? 0 : 1;
	}
	if (!strcmp(what, "spin-then-stop")) {
		/* A thread that spins on an empty CQ drives every QP of the
		 * process; when it stops polling (and does not arm a CQ), the
		 * progress threads must take the input back: a Write lands with
		 * nobody polling anything. */
		unsigned char want[64];
		double end;
		for (int i = 0; i < 1000; i++)
			if (ibv_poll_cq(c.cq, 4, wc) < 0)
				DIE("ibv_poll_cq");
		for (int i = 0; i < 64; i++)
			want[i] = c.buf[i] = pat(i, 9);
		post(&c, IBV_WR_RDMA_WRITE, 0, 64, &to, 0);
		end = now() + 10;
		while (memcmp(s.buf, want, 64) != 0)
			if (now() > end) {
				printf("the Write never landed after the poller stopped\n");
				return 1;
			}
		printf("the Write landed after the poller stopped\n");
		return 0;
	}
	if (!strcmp(what, "idle-spin")) {
		/* 300 ms of polls on a CQ that gets nothing: past 1 ms without a
		 * completion the thread waits in the kernel for input (spin.rs),
		 * counted in its voluntary context switches; a pure spin makes
		 * none. Then a Send arrives and must complete as usual. */
		struct rusage r0, r1;
		struct timespec c0, c1;
		unsigned char want[64];
		double t0, end;
		post_recv(&c, 0, 64);
		getrusage(RUSAGE_THREAD, &r0);
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
		t0 = now();
		while (now() < t0 + 0.3)
			if (ibv_poll_cq(c.cq, 4, wc) != 0) {
				printf("a completion nobody asked for\n");
				return 1;
			}
		getrusage(RUSAGE_THREAD, &r1);
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
		printf("spinning 300 ms on an empty CQ: %ld voluntary switches, %.0f%% of a core\n",
		       r1.ru_nvcsw - r0.ru_nvcsw,
		       100 * ((c1.tv_sec - c0.tv_sec) + (c1.tv_nsec - c0.tv_nsec) / 1e9) / (now() - t0));
		for (int i = 0; i < 64; i++)
			want[i] = s.buf[i] = pat(i, 13);
		post(&s, IBV_WR_SEND, 0, 64, NULL, 0);
		n = 0;
		for (end = now() + 10; n == 0 && now() < end;)
			if ((n = ibv_poll_cq(c.cq, 1, wc)) < 0)
				DIE("ibv_poll_cq");
		if (n != 1 || wc[0].status != IBV_WC_SUCCESS || wc[0].opcode != IBV_WC_RECV ||
		    memcmp(c.buf, want, 64) != 0) {
			printf("the Send after the idle spin: %s\n", n ? ibv_wc_status_str(wc[0].status) : "no completion");
			return 1;
		}
		printf("the Send after the idle spin arrived intact\n");
		return 0;
	}
	if (!strcmp(what, "held-write")) {
		/* Signaled Writes nobody reaps: a post made while 16 completions
		 * wait is held for the application's next poll (cork.rs). No
		 * poll comes here: the Write must still land, on its own. */
		unsigned char want[64];
		double end;
		for (int i = 0; i < 20; i++)
			post(&c, IBV_WR_RDMA_WRITE, 0, 8, &to, 0);
		for (int i = 0; i < 64; i++)
			want[i] = c.buf[64 + i] = pat(i, 11);
		post(&c, IBV_WR_RDMA_WRITE, 64, 64, &to, 64);
		end = now() + 10;
		while (memcmp(s.buf + 64, want, 64) != 0)
			if (now() > end) {
				printf("the held Write never landed\n");
				return 1;
			}
		printf("the held Write landed without a poll\n");
		n = 0;
		for (end = now() + 10; n < 21 && now() < end;) {
			int got = ibv_poll_cq(c.cq, 4, wc);
			if (got < 0)
				DIE("ibv_poll_cq");
			for (int i = 0; i < got; i++)
				if (wc[i].status != IBV_WC_SUCCESS) {
					printf("completion %d: %s\n", n + i, ibv_wc_status_str(wc[i].status));
					return 1;
				}
			n += got;
		}
		printf("completions: %d\n", n);
		return n == 21 ? 0 : 1;
	}
	fprintf(stderr, "unknown case %s\n", what);
	return 2;
}

/* ibv_query_qp reports the capabilities the QP was created with. */
static int query_qp(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *ctx = ibv_open_device(l[0]);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = { 8, 4, 2, 1, 16 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	if (!qp)
		DIE("ibv_create_qp");
	if (ibv_query_qp(qp, &qa, IBV_QP_CAP, &qi))
		DIE("ibv_query_qp");
	printf("caps %u %u %u %u %u, init caps %u %u %u %u %u\n", qa.cap.max_send_wr, qa.cap.max_recv_wr,
	       qa.cap.max_send_sge, qa.cap.max_recv_sge, qa.cap.max_inline_data, qi.cap.max_send_wr,
	       qi.cap.max_recv_wr, qi.cap.max_send_sge, qi.cap.max_recv_sge, qi.cap.max_inline_data);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(l);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if ((argc == 3 || argc == 4) && !strcmp(argv[1], "server"))
		return share_opt(argc == 4 ? argv[3] : NULL) || server(argv[2]);
	if ((argc == 4 || argc == 5) && !strcmp(argv[1], "client"))
		return share_opt(argc == 5 ? argv[4] : NULL) || client(argv[2], argv[3]);
	if (argc == 2 && !strcmp(argv[1], "query-qp"))
		return query_qp();
	if (argc == 3 && !strcmp(argv[1], "misuse"))
		return misuse(argv[2]);
	if (argc == 3 && !strcmp(argv[1], "notify"))
		return notify(argv[2]);
	fprintf(stderr, "usage: verbs_check server PORT | client HOST PORT | misuse CASE | notify CASE\n");
	return 2;
}
