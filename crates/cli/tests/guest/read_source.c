/*
 * A passive RDMA Read source built on rdma-core (librdmacm + libibverbs),
 * run in the kvm-rdma guest on Linux siw: the responder of softrdma's
 * scattered Reads (issue 29). It registers LEN bytes with remote read,
 * fills them with the pattern below, and once connected sends one 16-byte
 * message: the buffer's address (8 bytes), rkey (4) and length (4), all
 * big-endian. The initiator then RDMA-Reads it as it likes (siw answers
 * each Read Request in the kernel; this program is not involved) and
 * finally sends "DONE", which ends the program.
 *
 * Pattern: byte i is (i * 2654435761) >> 13 XOR (i >> 9), truncated to 8
 * bits (it differs between neighbouring bytes and between 512-byte blocks).
 *
 * usage: read_source ADDR PORT LEN   (ADDR: the guest's address, 10.0.2.15)
 * Prints LISTENING, then SERVED when "DONE" arrives.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); exit(1); } while (0)

static uint8_t pattern(uint64_t i) {
	return (uint8_t)((uint32_t)(i * 2654435761u) >> 13) ^ (uint8_t)(i >> 9);
}

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

static void put_be(char *p, uint64_t v, int n) {
	for (int k = n - 1; k >= 0; k--) {
		p[k] = (char)(v & 0xff);
		v >>= 8;
	}
}

int main(int argc, char **argv) {
	if (argc != 4)
		DIE("usage: %s ADDR PORT LEN", argv[0]);
	int port = atoi(argv[2]);
	size_t len = (size_t)atol(argv[3]);
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
	char *src = malloc(len);
	char *msg = calloc(1, 256);
	if (!src || !msg)
		DIE("out of memory");
	for (size_t i = 0; i < len; i++)
		src[i] = (char)pattern(i);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_mr *mmr = ibv_reg_mr(pd, msg, 256, IBV_ACCESS_LOCAL_WRITE);
	if (!smr || !mmr)
		DIE("ibv_reg_mr failed");
	struct ibv_sge rs = { .addr = (uintptr_t)msg + 64, .length = 64, .lkey = mmr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 1, .sg_list = &rs, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(id->qp, &rw, &rbad))
		DIE("ibv_post_recv failed");
	/* Up to 16 Reads outstanding from the initiator. */
	struct rdma_conn_param cp = { .initiator_depth = 1, .responder_resources = 16 };
	if (rdma_accept(id, &cp))
		DIE("rdma_accept failed");
	if (rdma_get_cm_event(ec, &ev) || ev->event != RDMA_CM_EVENT_ESTABLISHED)
		DIE("not established");
	rdma_ack_cm_event(ev);
	put_be(msg, (uintptr_t)src, 8);
	put_be(msg + 8, smr->rkey, 4);
	put_be(msg + 12, len, 4);
	struct ibv_sge ss = { .addr = (uintptr_t)msg, .length = 16, .lkey = mmr->lkey };
	struct ibv_send_wr sw = {
		.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *sbad;
	if (ibv_post_send(id->qp, &sw, &sbad))
		DIE("Send post failed");
	int sent = 0, done = 0;
	while (!sent || !done) {
		struct ibv_wc wc = poll_one(cq);
		if (wc.opcode == IBV_WC_RECV) {
			if (wc.byte_len != 4 || memcmp(msg + 64, "DONE", 4))
				DIE("unexpected message of %u bytes", wc.byte_len);
			done = 1;
		} else if (wc.wr_id == 2) {
			sent = 1;
		}
	}
	printf("SERVED\n");
	fflush(stdout);
	rdma_get_cm_event(ec, &ev); /* the disconnect */
	return 0;
}
