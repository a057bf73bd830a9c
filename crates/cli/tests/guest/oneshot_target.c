/*
 * A one-shot target built on rdma-core (librdmacm + libibverbs), run in
 * the kvm-rdma guest on Linux siw: the standard side of softrdma's
 * one-shot advertise/close (docs/one-shot.md). For each of N commands it
 * receives a Send whose payload starts with the advertised STag and the
 * data length (both big-endian), RDMA-Reads that many bytes at address 0
 * under the STag, and answers with a Send with Invalidate of the STag
 * whose payload is a checksum (FNV-1a, big-endian) of the bytes it read.
 *
 * usage: oneshot_target ADDR PORT N   (ADDR: the guest's address, 10.0.2.15)
 * Once connected it sends "RDY!"; the initiator sends its first command
 * after receiving it.
 * Prints LISTENING, then one "CMD i stag len sum" line per command, then DONE.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)
#define MAXLEN (256 * 1024)

/* Completions arrive in any order across the send and receive queues (a
 * command's receive can complete before the send completion of the
 * previous answer is reported): a receive that completes while we wait for
 * a send is kept for the next wait_recv. */
static int held_recv;
static uint32_t held_len;

static struct ibv_wc poll_one(struct ibv_cq *cq) {
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0)
		DIE("ibv_poll_cq failed");
	if (wc.status != IBV_WC_SUCCESS)
		DIE("wr %llu failed: %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	return wc;
}

/* Waits for the completion of send-queue WR `wr_id`. */
static void wait_send(struct ibv_cq *cq, uint64_t wr_id) {
	for (;;) {
		struct ibv_wc wc = poll_one(cq);
		if (wc.opcode == IBV_WC_RECV) {
			if (held_recv)
				DIE("two commands at once");
			held_recv = 1;
			held_len = wc.byte_len;
			continue;
		}
		if (wc.wr_id == wr_id)
			return;
	}
}

/* Waits for a received command; returns its length. */
static uint32_t wait_recv(struct ibv_cq *cq) {
	if (held_recv) {
		held_recv = 0;
		return held_len;
	}
	for (;;) {
		struct ibv_wc wc = poll_one(cq);
		if (wc.opcode == IBV_WC_RECV)
			return wc.byte_len;
	}
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf) {
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 256, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(qp, &wr, &bad))
		DIE("ibv_post_recv failed");
}

int main(int argc, char **argv) {
	if (argc != 4)
		DIE("usage: %s ADDR PORT N", argv[0]);
	int port = atoi(argv[2]), n = atoi(argv[3]);
	struct rdma_event_channel *ec = rdma_create_event_channel();
	struct rdma_cm_id *lid, *id;
	struct rdma_cm_event *ev;
	if (!ec || rdma_create_id(ec, &lid, NULL, RDMA_PS_TCP))
		DIE("rdma_create_id failed");
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1)
		DIE("bad address %s", argv[1]);
	if (rdma_bind_addr(lid, (struct sockaddr *)&a) || rdma_listen(lid, 1))
		DIE("listen failed");
	printf("LISTENING\n");
	fflush(stdout);
	if (rdma_get_cm_event(ec, &ev) || ev->event != RDMA_CM_EVENT_CONNECT_REQUEST)
		DIE("no connect request");
	id = ev->id;
	rdma_ack_cm_event(ev);
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	if (!pd || !cq || rdma_create_qp(id, pd, &qa))
		DIE("QP set-up failed");
	char *buf = calloc(1, 256 + MAXLEN + 64);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 256 + MAXLEN + 64, IBV_ACCESS_LOCAL_WRITE);
	if (!buf || !mr)
		DIE("ibv_reg_mr failed");
	char *data = buf + 256, *resp = buf + 256 + MAXLEN;
	post_recv(id->qp, mr, buf);
	struct rdma_conn_param cp = { .initiator_depth = 1, .responder_resources = 1 };
	if (rdma_accept(id, &cp))
		DIE("rdma_accept failed");
	if (rdma_get_cm_event(ec, &ev) || ev->event != RDMA_CM_EVENT_ESTABLISHED)
		DIE("not established");
	rdma_ack_cm_event(ev);
	/* Tell the initiator we are established: it sends its first command
	 * after this arrives. */
	memcpy(resp, "RDY!", 4);
	struct ibv_sge rdy = { .addr = (uintptr_t)resp, .length = 4, .lkey = mr->lkey };
	struct ibv_send_wr rw = {
		.wr_id = 4, .sg_list = &rdy, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *rbad;
	if (ibv_post_send(id->qp, &rw, &rbad))
		DIE("ready Send post failed");
	wait_send(cq, 4);
	for (int i = 0; i < n; i++) {
		uint32_t got = wait_recv(cq);
		if (got < 8)
			DIE("command %d: %u bytes", i, got);
		uint32_t stag, len;
		memcpy(&stag, buf, 4);
		memcpy(&len, buf + 4, 4);
		stag = ntohl(stag);
		len = ntohl(len);
		if (len > MAXLEN)
			DIE("length %u too large", len);
		post_recv(id->qp, mr, buf);
		struct ibv_sge rs = { .addr = (uintptr_t)data, .length = len, .lkey = mr->lkey };
		struct ibv_send_wr rd = {
			.wr_id = 2, .sg_list = &rs, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = 0, .rkey = stag },
		}, *bad;
		if (ibv_post_send(id->qp, &rd, &bad))
			DIE("RDMA Read post failed");
		wait_send(cq, 2);
		uint32_t h = 2166136261u;
		for (uint32_t k = 0; k < len; k++)
			h = (h ^ (uint8_t)data[k]) * 16777619u;
		uint32_t hb = htonl(h);
		memcpy(resp, &hb, 4);
		struct ibv_sge ss = { .addr = (uintptr_t)resp, .length = 4, .lkey = mr->lkey };
		struct ibv_send_wr sw = {
			.wr_id = 3, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
			.send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = stag,
			/* rdma-core 44's siw provider takes the STag to invalidate
			 * from here, not from invalidate_rkey (it sent 0 without). */
			.wr.rdma = { .rkey = stag },
		};
		if (ibv_post_send(id->qp, &sw, &bad))
			DIE("Send with Invalidate post failed");
		wait_send(cq, 3);
		printf("CMD %d %#x %u %#x\n", i, stag, len, h);
		fflush(stdout);
	}
	printf("DONE %d\n", n);
	fflush(stdout);
	rdma_get_cm_event(ec, &ev); /* the disconnect */
	return 0;
}
