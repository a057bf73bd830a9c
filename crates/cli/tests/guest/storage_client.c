/*
 * A storage client built on rdma-core (librdmacm + libibverbs), run in the
 * kvm-rdma guest on Linux siw against `softrdma storage serve` on the host
 * (docs/storage.md, "The endpoint"). Everything it does is plain verbs on
 * the RFC 5040 wire; only the MPA private data and the control messages
 * follow the storage target's formats.
 *
 * usage: storage_client HOST PORT TOKEN_HEX
 *
 * 1. Connects with a wrong token: the target must refuse (REJECTED line,
 *    with the reason from the reject's private data when siw passes it).
 * 2. Connects (strict ordering) with the token, lists the partitions from
 *    the accept (at most 15; it says how many there are in all) and, when
 *    there are more, asks for the rest with Info control messages (pages
 *    from a partition index on), reads 4 KiB of the last partition (one
 *    only Info listed; the host filled it), pings over Send/Receive,
 *    RDMA-Writes N ranges (two of
 *    them overlap: the later Write must win) into the read-write partition,
 *    issues a zero-length RDMA Read (the flush), a FlushAll control
 *    message, reads everything back and compares it with its own model;
 *    reads a range of the read-only partition (filled by the host) and
 *    checks it; then RDMA-Writes into the read-only partition, which must
 *    fail the connection (the Write or the Read after it completes with an
 *    error).
 * 3. Connects with relaxed ordering, Writes 16 disjoint ranges, flushes and
 *    reads them back.
 * 4. Connects again, prints REVOKE-READY and waits (asking Info) until the
 *    host's `storage revoke ... w` has narrowed the read-write partition
 *    to read on this live connection; reads it through the same STag,
 *    then Writes to it, which the target must refuse (a Terminate).
 * Prints one line per step; the host checks the lines and then the bytes
 * in the store file itself. Exits non-zero on the first failed check.
 *
 * The bytes of Write k at partition offset o: pat(o, k) below (the host's
 * test computes the same).
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); printf("FAILED\n"); fflush(stdout); exit(1); } while (0)
#define MODEL (2u << 20)
#define BUFLEN (MODEL + (1u << 20))
#define CTRL 512
#define RECVS 4

static uint8_t pat(uint64_t o, unsigned k) {
	return (uint8_t)(((uint32_t)o * 2654435761u) >> 11) ^ (uint8_t)(k * 37u);
}

struct conn {
	struct rdma_event_channel *ec;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *scq, *rcq;
	struct ibv_mr *mr;
	uint8_t *buf;  /* BUFLEN data, then RECVS control slots, then one send slot */
	uint8_t accept[256];
	int accept_len;
};

/* The payload of the last control reply. */
static uint8_t reply[CTRL];
static int reply_len;

static uint8_t *ctrl_slot(struct conn *c, int i) { return c->buf + BUFLEN + (size_t)i * CTRL; }

static struct rdma_cm_event *expect_event(struct conn *c, enum rdma_cm_event_type t) {
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(c->ec, &ev))
		DIE("rdma_get_cm_event failed");
	if (ev->event != t)
		DIE("CM event %s, expected %s", rdma_event_str(ev->event), rdma_event_str(t));
	return ev;
}

static void post_ctrl_recv(struct conn *c, int i) {
	struct ibv_sge s = { .addr = (uintptr_t)ctrl_slot(c, i), .length = CTRL, .lkey = c->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &s, .num_sge = 1 }, *bad;
	if (ibv_post_recv(c->id->qp, &wr, &bad))
		DIE("ibv_post_recv failed");
}

/* Sets up and connects; returns 1 when established, 0 when rejected
 * (the reason, if any, in *why). */
static int connect_to(struct conn *c, const char *host, int port, const uint8_t *token,
		      int relaxed, char *why, size_t whylen) {
	memset(c, 0, sizeof *c);
	struct rdma_cm_event *ev;
	c->ec = rdma_create_event_channel();
	if (!c->ec || rdma_create_id(c->ec, &c->id, NULL, RDMA_PS_TCP))
		DIE("rdma_create_id failed");
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, host, &a.sin_addr) != 1)
		DIE("bad address %s", host);
	if (rdma_resolve_addr(c->id, NULL, (struct sockaddr *)&a, 5000))
		DIE("rdma_resolve_addr failed");
	rdma_ack_cm_event(expect_event(c, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(c->id, 5000))
		DIE("rdma_resolve_route failed");
	rdma_ack_cm_event(expect_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED));
	c->pd = ibv_alloc_pd(c->id->verbs);
	c->scq = ibv_create_cq(c->id->verbs, 64, NULL, NULL, 0);
	c->rcq = ibv_create_cq(c->id->verbs, 64, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = {
		.send_cq = c->scq, .recv_cq = c->rcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 32, .max_recv_wr = RECVS, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (!c->pd || !c->scq || !c->rcq || rdma_create_qp(c->id, c->pd, &qa))
		DIE("QP set-up failed");
	size_t len = BUFLEN + (RECVS + 1) * CTRL;
	c->buf = calloc(1, len);
	c->mr = ibv_reg_mr(c->pd, c->buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!c->buf || !c->mr)
		DIE("ibv_reg_mr failed");
	for (int i = 0; i < RECVS; i++)
		post_ctrl_recv(c, i);
	uint8_t req[40] = { 'S', 'R', 'S', 'Q', 1, relaxed ? 1 : 0, 0, 0 };
	memcpy(req + 8, token, 32);
	struct rdma_conn_param cp = {
		.initiator_depth = 8, .responder_resources = 8,
		.private_data = req, .private_data_len = sizeof req,
	};
	if (rdma_connect(c->id, &cp))
		DIE("rdma_connect failed");
	if (rdma_get_cm_event(c->ec, &ev))
		DIE("rdma_get_cm_event failed");
	const uint8_t *p = ev->param.conn.private_data;
	int plen = ev->param.conn.private_data_len;
	if (ev->event == RDMA_CM_EVENT_REJECTED) {
		why[0] = 0;
		if (p && plen > 4 && !memcmp(p, "SRSJ", 4)) {
			size_t n = plen - 4 < (int)whylen - 1 ? (size_t)plen - 4 : whylen - 1;
			memcpy(why, p + 4, n);
			why[n] = 0;
		}
		rdma_ack_cm_event(ev);
		return 0;
	}
	if (ev->event != RDMA_CM_EVENT_ESTABLISHED)
		DIE("CM event %s on connect", rdma_event_str(ev->event));
	if (!p || plen < 8 || plen > (int)sizeof c->accept)
		DIE("accept private data: %d bytes", plen);
	memcpy(c->accept, p, plen);
	c->accept_len = plen;
	rdma_ack_cm_event(ev);
	return 1;
}

struct part { unsigned index, rights; uint32_t stag; uint64_t len; };

/* A partition listing (an accept, or an Info reply's payload): its entries
 * into out (at most max), the number in all into *total. (The target's
 * private data may carry trailing zeros from rdma_cm's fixed-size copy:
 * the count decides.) */
static int listing(const uint8_t *a, int alen, struct part *out, int max, int *total) {
	if (alen < 8 || memcmp(a, "SRSA", 4) || a[4] != 1)
		DIE("not a storage partition listing");
	int n = a[5];
	*total = a[6] << 8 | a[7];
	if (n > max || 8 + 16 * n > alen || *total < n)
		DIE("listing of %d partitions (of %d) in %d bytes", n, *total, alen);
	for (int i = 0; i < n; i++) {
		const uint8_t *e = a + 8 + 16 * i;
		uint32_t stag;
		uint64_t len = 0;
		memcpy(&stag, e + 4, 4);
		for (int k = 0; k < 8; k++)
			len = len << 8 | e[8 + k];
		out[i] = (struct part){ (unsigned)(e[0] << 8 | e[1]), e[2], ntohl(stag), len };
	}
	return n;
}

static int control_arg(struct conn *c, uint8_t op, uint16_t arg, uint64_t id);

/* Every partition of the connection: the accept's, then Info pages from
 * the index after the last one known until a page lists nothing more. */
static int partitions(struct conn *c, struct part *out, int max, int *by_info) {
	int total;
	int n = listing(c->accept, c->accept_len, out, max, &total);
	*by_info = 0;
	while (n < total) {
		uint16_t start = n ? (uint16_t)(out[n - 1].index + 1) : 0;
		if (control_arg(c, 3, start, 500 + n) != 0)
			DIE("Info failed");
		int t, k = listing(reply, reply_len, out + n, max - n, &t);
		if (k == 0)
			break;
		if (out[n].index < start)
			DIE("Info page starts at partition %u, asked for %u", out[n].index, start);
		n += k;
		*by_info += k;
	}
	if (n != total)
		DIE("%d partitions listed, %d reachable", n, total);
	return n;
}

static int try_post(struct conn *c, enum ibv_wr_opcode op, uint64_t wr_id, uint8_t *local,
		    uint32_t len, uint32_t stag, uint64_t raddr) {
	struct ibv_sge s = { .addr = (uintptr_t)local, .length = len, .lkey = c->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &s, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = raddr, .rkey = stag },
	}, *bad;
	return ibv_post_send(c->id->qp, &wr, &bad);
}

static void post(struct conn *c, enum ibv_wr_opcode op, uint64_t wr_id, uint8_t *local,
		 uint32_t len, uint32_t stag, uint64_t raddr) {
	if (try_post(c, op, wr_id, local, len, stag, raddr))
		DIE("ibv_post_send (opcode %d, wr %llu) failed", op, (unsigned long long)wr_id);
}

/* Polls the send CQ for `n` completions, all of which must succeed. */
static void wait_ok(struct conn *c, int n, const char *what) {
	while (n > 0) {
		struct ibv_wc wc;
		int got = ibv_poll_cq(c->scq, 1, &wc);
		if (got < 0)
			DIE("ibv_poll_cq failed");
		if (got == 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS)
			DIE("%s: wr %llu failed: %s", what, (unsigned long long)wc.wr_id,
			    ibv_wc_status_str(wc.status));
		n--;
	}
}

/* One control request (`arg`: Info's first partition index) and its
 * reply; returns the reply's status, the payload in reply/reply_len. */
static int control_arg(struct conn *c, uint8_t op, uint16_t arg, uint64_t id) {
	uint8_t *m = ctrl_slot(c, RECVS);
	uint8_t req[16] = { 'S', 'R', 'S', 'C', 1, op, (uint8_t)(arg >> 8), (uint8_t)arg };
	for (int k = 0; k < 8; k++)
		req[8 + k] = (uint8_t)(id >> (56 - 8 * k));
	memcpy(m, req, 16);
	post(c, IBV_WR_SEND, 900 + op, m, 16, 0, 0);
	wait_ok(c, 1, "control Send");
	struct ibv_wc wc;
	int got;
	while ((got = ibv_poll_cq(c->rcq, 1, &wc)) == 0)
		;
	if (got < 0 || wc.status != IBV_WC_SUCCESS)
		DIE("control reply: %s", got < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
	uint8_t *r = ctrl_slot(c, (int)wc.wr_id);
	if (wc.byte_len < 16 || memcmp(r, "SRSR", 4) || r[4] != 1 || r[5] != op || memcmp(r + 8, req + 8, 8))
		DIE("control reply malformed (%u bytes)", wc.byte_len);
	int status = r[6];
	reply_len = (int)wc.byte_len - 16;
	memcpy(reply, r + 16, reply_len);
	post_ctrl_recv(c, (int)wc.wr_id);
	return status;
}

static int control(struct conn *c, uint8_t op, uint64_t id) { return control_arg(c, op, 0, id); }

static void teardown(struct conn *c) {
	rdma_destroy_qp(c->id);
	ibv_dereg_mr(c->mr);
	free(c->buf);
	ibv_destroy_cq(c->scq);
	ibv_destroy_cq(c->rcq);
	ibv_dealloc_pd(c->pd);
	rdma_destroy_id(c->id);
	rdma_destroy_event_channel(c->ec);
}

static void disconnect(struct conn *c) {
	rdma_disconnect(c->id);
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(c->ec, &ev) == 0)
		rdma_ack_cm_event(ev);
	teardown(c);
}

/* The strict connection's Writes (offset, length); 1 and 3 overlap. The
 * last one ends at the partition's end (offset filled in at run time). */
static const uint32_t W[][2] = {
	{ 0, 4096 }, { 12388, 70000 }, { 1u << 20, (200u << 10) + 5 },
	{ 50000, 30000 }, { 0, 1000 },
};
#define NW (sizeof W / sizeof W[0])
#define RELAXED_AT (3u << 20)

int main(int argc, char **argv) {
	if (argc != 4 || strlen(argv[3]) != 64)
		DIE("usage: %s HOST PORT TOKEN_HEX(64)", argv[0]);
	const char *host = argv[1];
	int port = atoi(argv[2]);
	uint8_t token[32], bad[32];
	for (int i = 0; i < 32; i++) {
		unsigned x;
		if (sscanf(argv[3] + 2 * i, "%2x", &x) != 1)
			DIE("bad token");
		token[i] = x;
		bad[i] = x ^ 0x5a;
	}
	char why[200];
	struct conn c;

	/* 1: a wrong token is refused at connect time. */
	if (connect_to(&c, host, port, bad, 0, why, sizeof why))
		DIE("connected with a wrong token");
	printf("REJECTED reason=[%s]\n", why);
	fflush(stdout);
	teardown(&c);

	/* 2: strict. */
	if (!connect_to(&c, host, port, token, 0, why, sizeof why))
		DIE("refused: %s", why);
	struct part ps[64];
	int by_info;
	int np = partitions(&c, ps, 64, &by_info);
	printf("LISTED %d PARTITIONS (%d by Info)\n", np, by_info);
	struct part *rw = NULL, *ro = NULL;
	for (int i = 0; i < np; i++) {
		printf("PARTITION %u rights %u stag %#x len %llu\n", ps[i].index, ps[i].rights,
		       ps[i].stag, (unsigned long long)ps[i].len);
		if (ps[i].rights == 3 && !rw)
			rw = &ps[i];
		if (ps[i].rights == 1 && !ro)
			ro = &ps[i];
	}
	if (!rw || !ro || rw->len < 4 * MODEL)
		DIE("need a read-write partition of 8 MiB and a read-only one");
	if (control(&c, 1, 0x1122334455667788ull) != 0)
		DIE("Ping failed");
	printf("PING OK\n");
	/* The last partition: listed by Info only when the accept could not
	 * hold it; the host filled its first 4 KiB with pat(o, 77). */
	struct part *last = &ps[np - 1];
	post(&c, IBV_WR_RDMA_READ, 40, c.buf, 4096, last->stag, 0);
	wait_ok(&c, 1, "Read of the last partition");
	for (uint32_t i = 0; i < 4096; i++)
		if (c.buf[i] != pat(i, 77))
			DIE("last partition (%u): byte %u differs", last->index, i);
	printf("LAST-PARTITION %u READ OK\n", last->index);
	fflush(stdout);
	fflush(stdout);

	/* The model of the partition's first MODEL bytes and its last 4 KiB. */
	uint8_t *model = calloc(1, MODEL), *tail = calloc(1, 4096);
	uint64_t tail_at = rw->len - 4096;
	uint8_t *data = c.buf;
	for (unsigned k = 0; k < NW; k++) {
		uint64_t off = W[k][0], len = W[k][1];
		if (k == NW - 1)
			off = rw->len - len;
		for (uint64_t i = 0; i < len; i++) {
			uint8_t b = pat(off + i, k);
			if (off + i < MODEL)
				model[off + i] = b;
			else if (off + i >= tail_at)
				tail[off + i - tail_at] = b;
		}
	}
	/* Post them all back to back (strict: executed in order at the
	 * target), each from its own part of the buffer, then the flush. */
	size_t at = 0;
	for (unsigned k = 0; k < NW; k++) {
		uint64_t off = W[k][0], len = W[k][1];
		if (k == NW - 1)
			off = rw->len - len;
		for (uint64_t i = 0; i < len; i++)
			data[at + i] = pat(off + i, k);
		post(&c, IBV_WR_RDMA_WRITE, k, data + at, len, rw->stag, off);
		at += (len + 63) & ~63ull;
	}
	post(&c, IBV_WR_RDMA_READ, 50, data + at, 0, rw->stag, 0);
	wait_ok(&c, NW + 1, "strict Writes and flush");
	printf("FLUSH OK\n");
	if (control(&c, 2, 7) != 0)
		DIE("FlushAll failed");
	printf("FLUSHALL OK\n");
	memset(data, 0xee, MODEL + 4096);
	post(&c, IBV_WR_RDMA_READ, 60, data, MODEL, rw->stag, 0);
	post(&c, IBV_WR_RDMA_READ, 61, data + MODEL, 4096, rw->stag, tail_at);
	wait_ok(&c, 2, "read back");
	for (uint32_t i = 0; i < MODEL; i++)
		if (data[i] != model[i])
			DIE("strict: byte %u is %#x, wrote %#x", i, data[i], model[i]);
	if (memcmp(data + MODEL, tail, 4096))
		DIE("strict: the partition's last 4 KiB differ");
	printf("STRICT VERIFIED %u writes\n", (unsigned)NW);

	/* The read-only partition: the host filled [0, 256 KiB) with pat(o, 99). */
	post(&c, IBV_WR_RDMA_READ, 70, data, 100000, ro->stag, 12345);
	wait_ok(&c, 1, "read-only partition Read");
	for (uint32_t i = 0; i < 100000; i++)
		if (data[i] != pat(12345 + i, 99))
			DIE("read-only partition: byte %u differs", 12345 + i);
	printf("RO-READ OK\n");
	fflush(stdout);

	/* A Write without the right: the target answers with a Terminate;
	 * the Write (completed locally when sent, on iWARP) or the Read
	 * after it must fail. */
	memset(data, 0xab, 4096);
	post(&c, IBV_WR_RDMA_WRITE, 80, data, 4096, ro->stag, 0);
	int failed = 0, posted = 1;
	/* The Terminate may already have moved the QP to ERROR, where
	 * posting fails. */
	if (try_post(&c, IBV_WR_RDMA_READ, 81, data + 4096, 0, rw->stag, 0)) {
		printf("RO-WRITE next post refused\n");
		failed = 1;
	} else {
		posted = 2;
	}
	/* Until the first error: siw leaves WRs behind it on the dead QP
	 * without a completion until the QP is destroyed. */
	for (int n = 0; n < posted && !failed;) {
		struct ibv_wc wc;
		int got = ibv_poll_cq(c.scq, 1, &wc);
		if (got < 0)
			DIE("ibv_poll_cq failed");
		if (got == 0)
			continue;
		n++;
		if (wc.status != IBV_WC_SUCCESS) {
			printf("RO-WRITE wr %llu %s\n", (unsigned long long)wc.wr_id,
			       ibv_wc_status_str(wc.status));
			failed = 1;
		}
	}
	if (!failed)
		DIE("a Write to the read-only partition went through");
	printf("RO-WRITE REFUSED\n");
	fflush(stdout);
	disconnect(&c);

	/* 3: relaxed ordering: 16 disjoint Writes of 8-68 KiB, flush, read back. */
	if (!connect_to(&c, host, port, token, 1, why, sizeof why))
		DIE("relaxed connection refused: %s", why);
	np = partitions(&c, ps, 64, &by_info);
	rw = NULL;
	for (int i = 0; i < np; i++)
		if (ps[i].rights == 3)
			rw = &ps[i];
	if (!rw)
		DIE("no read-write partition on the relaxed connection");
	uint64_t off = RELAXED_AT;
	data = c.buf;
	at = 0;
	for (unsigned k = 0; k < 16; k++) {
		uint32_t len = 8192 + (k * 4100) % 61440;
		for (uint32_t i = 0; i < len; i++)
			data[at + i] = pat(off + i, 100 + k);
		post(&c, IBV_WR_RDMA_WRITE, k, data + at, len, rw->stag, off);
		at += len;
		off += len;
	}
	post(&c, IBV_WR_RDMA_READ, 50, data + at, 0, rw->stag, 0);
	wait_ok(&c, 17, "relaxed Writes and flush");
	uint64_t total = off - RELAXED_AT;
	memset(data, 0, total);
	post(&c, IBV_WR_RDMA_READ, 60, data, total, rw->stag, RELAXED_AT);
	wait_ok(&c, 1, "relaxed read back");
	off = RELAXED_AT;
	at = 0;
	for (unsigned k = 0; k < 16; k++) {
		uint32_t len = 8192 + (k * 4100) % 61440;
		for (uint32_t i = 0; i < len; i++)
			if (data[at + i] != pat(off + i, 100 + k))
				DIE("relaxed: byte %llu differs", (unsigned long long)(off + i));
		at += len;
		off += len;
	}
	printf("RELAXED VERIFIED %llu bytes\n", (unsigned long long)total);
	disconnect(&c);

	/* 4: a revoke while connected. */
	if (!connect_to(&c, host, port, token, 0, why, sizeof why))
		DIE("fourth connection refused: %s", why);
	np = partitions(&c, ps, 64, &by_info);
	if (ps[0].index != 0 || ps[0].rights != 3)
		DIE("partition 0 is not read-write before the revoke");
	uint32_t stag0 = ps[0].stag;
	printf("REVOKE-READY\n");
	fflush(stdout);
	for (int tries = 0;; tries++) {
		struct part now[64];
		int t, k = 0;
		if (control_arg(&c, 3, 0, 900 + tries) != 0)
			DIE("Info failed");
		k = listing(reply, reply_len, now, 64, &t);
		if (k > 0 && now[0].index == 0 && now[0].rights == 1) {
			if (now[0].stag != stag0)
				DIE("the narrowed partition has another STag");
			printf("NARROWED after %d Info requests\n", tries + 1);
			break;
		}
		if (tries > 6000)
			DIE("partition 0 was never narrowed to read");
		/* Not a busy loop: under TCG a spinning client starves the
		 * guest's console, and REVOKE-READY would reach the host only
		 * after it gave up. */
		usleep(20000);
	}
	data = c.buf;
	post(&c, IBV_WR_RDMA_READ, 70, data, 4096, stag0, 0);
	wait_ok(&c, 1, "Read after narrowing");
	for (uint32_t i = 0; i < 4096; i++)
		if (data[i] != model[i])
			DIE("narrowed: byte %u differs", i);
	printf("NARROWED-READ OK\n");
	fflush(stdout);
	memset(data, 0xcd, 4096);
	post(&c, IBV_WR_RDMA_WRITE, 80, data, 4096, stag0, 0);
	failed = 0;
	posted = 1;
	if (try_post(&c, IBV_WR_RDMA_READ, 81, data + 4096, 0, stag0, 0))
		failed = 1;
	else
		posted = 2;
	for (int n = 0; n < posted && !failed;) {
		struct ibv_wc wc;
		int got = ibv_poll_cq(c.scq, 1, &wc);
		if (got < 0)
			DIE("ibv_poll_cq failed");
		if (got == 0)
			continue;
		n++;
		if (wc.status != IBV_WC_SUCCESS) {
			printf("NARROWED-WRITE wr %llu %s\n", (unsigned long long)wc.wr_id,
			       ibv_wc_status_str(wc.status));
			failed = 1;
		}
	}
	if (!failed)
		DIE("a Write after the revoke went through");
	printf("NARROWED-WRITE REFUSED\n");
	fflush(stdout);
	disconnect(&c);
	printf("DONE\n");
	fflush(stdout);
	return 0;
}
