/*
 * A one-shot target built on rdma-core (librdmacm + libibverbs), run in
 * the kvm-rdma guest on Linux siw: the standard side of softrdma's
 * one-shot advertise/close (docs/one-shot.md). For each of N commands it
 * receives a Send whose payload starts with the advertised STag, the data
 * length and the command's flags (all big-endian, 4 bytes each), and
 * - RDMA-Reads that many bytes at address 0 under the STag (a SCSI write
 *   over iSER), or with flag WRITE RDMA-Writes them there (a storage
 *   read: byte k of command i is wpat(i, k));
 * - answers with a Send with Invalidate of the STag whose payload is a
 *   checksum (FNV-1a, big-endian) of the bytes it read or wrote, with
 *   IBV_SEND_SOLICITED under flag SOLICITED.
 * Flag CANCELLED: the initiator cancels the advertisement; the target
 * first waits for a further Send ("GO", sent after the cancel), then
 * makes its access, which must meet the dead STag: it prints
 * "ACCESS i status" with the access's completion status and stops (no
 * close; the connection is over).
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

/* Command flags (the third word of a command). */
#define WRITE 1
#define SOLICITED 2
#define CANCELLED 4

/* The bytes a WRITE command writes: byte k of command i. */
static uint8_t wpat(int i, uint32_t k) {
	return (uint8_t)(k * 131u + (uint32_t)i * 17u + (k >> 9));
}

/* Completions arrive in any order across the send and receive queues (a
 * command's receive can complete before the send completion of the
 * previous answer is reported): receives that complete while we wait for
 * a send are kept, in order, for the next wait_recv (at most the two
 * posted). */
static int held_recv;
static uint32_t held_len[2];
static uint64_t held_id[2];

/* Two receives are posted at all times, in two slots of 256 bytes (wr_id
 * RECV_ID + slot): the initiator may send the "GO" of a cancelled command
 * right after the command, before the target could post another. */
#define RECV_ID 100

/* The next completion; one that failed ends the program unless `any`. */
static struct ibv_wc poll_next(struct ibv_cq *cq, int any) {
	struct ibv_wc wc;
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0)
		DIE("ibv_poll_cq failed");
	if (wc.status != IBV_WC_SUCCESS && !any)
		DIE("wr %llu failed: %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	return wc;
}

static struct ibv_wc poll_one(struct ibv_cq *cq) {
	return poll_next(cq, 0);
}

/* Waits for the completion of send-queue WR `wr_id`; returns its status
 * (any status with `any`, else only success). */
static enum ibv_wc_status wait_send_any(struct ibv_cq *cq, uint64_t wr_id, int any) {
	for (;;) {
		struct ibv_wc wc = poll_next(cq, any);
		if (wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV) {
			if (held_recv == 2)
				DIE("more receives than posted");
			held_len[held_recv] = wc.byte_len;
			held_id[held_recv] = wc.wr_id;
			held_recv++;
			continue;
		}
		if (wc.wr_id == wr_id)
			return wc.status;
	}
}

static void wait_send(struct ibv_cq *cq, uint64_t wr_id) {
	wait_send_any(cq, wr_id, 0);
}

/* Waits for a received message; returns its length, its slot in *slot. */
static uint32_t wait_recv(struct ibv_cq *cq, int *slot) {
	if (held_recv) {
		uint32_t len = held_len[0];
		*slot = (int)(held_id[0] - RECV_ID);
		held_len[0] = held_len[1];
		held_id[0] = held_id[1];
		held_recv--;
		return len;
	}
	for (;;) {
		struct ibv_wc wc = poll_one(cq);
		if (wc.opcode == IBV_WC_RECV) {
			*slot = (int)(wc.wr_id - RECV_ID);
			return wc.byte_len;
		}
	}
}

static void post_recv(struct ibv_qp *qp, struct ibv_mr *mr, char *buf, int slot) {
	struct ibv_sge sge = { .addr = (uintptr_t)(buf + 256 * slot), .length = 256, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = RECV_ID + slot, .sg_list = &sge, .num_sge = 1 }, *bad;
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
	char *buf = calloc(1, 512 + MAXLEN + 64);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 512 + MAXLEN + 64, IBV_ACCESS_LOCAL_WRITE);
	if (!buf || !mr)
		DIE("ibv_reg_mr failed");
	char *data = buf + 512, *resp = buf + 512 + MAXLEN;
	post_recv(id->qp, mr, buf, 0);
	post_recv(id->qp, mr, buf, 1);
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
		int slot;
		uint32_t got = wait_recv(cq, &slot);
		char *cmd = buf + 256 * slot;
		if (got < 12)
			DIE("command %d: %u bytes", i, got);
		uint32_t stag, len, flags;
		memcpy(&stag, cmd, 4);
		memcpy(&len, cmd + 4, 4);
		memcpy(&flags, cmd + 8, 4);
		stag = ntohl(stag);
		len = ntohl(len);
		flags = ntohl(flags);
		if (len > MAXLEN)
			DIE("length %u too large", len);
		post_recv(id->qp, mr, buf, slot);
		if (flags & CANCELLED) {
			/* The initiator cancels, then says GO (in the other slot). */
			if (wait_recv(cq, &slot) != 2 || memcmp(buf + 256 * slot, "GO", 2))
				DIE("command %d: no GO", i);
		}
		if (flags & WRITE)
			for (uint32_t k = 0; k < len; k++)
				data[k] = (char)wpat(i, k);
		struct ibv_sge rs = { .addr = (uintptr_t)data, .length = len, .lkey = mr->lkey };
		struct ibv_send_wr rd = {
			.wr_id = 2, .sg_list = &rs, .num_sge = 1,
			.opcode = (flags & WRITE) ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ,
			.send_flags = IBV_SEND_SIGNALED,
			.wr.rdma = { .remote_addr = 0, .rkey = stag },
		}, *bad;
		if (ibv_post_send(id->qp, &rd, &bad))
			DIE("RDMA %s post failed", (flags & WRITE) ? "Write" : "Read");
		if (flags & CANCELLED) {
			enum ibv_wc_status st = wait_send_any(cq, 2, 1);
			printf("ACCESS %d %s\n", i, ibv_wc_status_str(st));
			fflush(stdout);
			break;
		}
		wait_send(cq, 2);
		uint32_t h = 2166136261u;
		for (uint32_t k = 0; k < len; k++)
			h = (h ^ (uint8_t)data[k]) * 16777619u;
		uint32_t hb = htonl(h);
		memcpy(resp, &hb, 4);
		struct ibv_sge ss = { .addr = (uintptr_t)resp, .length = 4, .lkey = mr->lkey };
		struct ibv_send_wr sw = {
			.wr_id = 3, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
			.send_flags = IBV_SEND_SIGNALED | ((flags & SOLICITED) ? IBV_SEND_SOLICITED : 0),
			.invalidate_rkey = stag,
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
