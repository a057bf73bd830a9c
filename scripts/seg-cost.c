// seg-cost: what the kernel charges a loopback TCP sender per message,
// without any framing (BENCHMARKS.md, issue 17 fifth part).
//   gcc -O2 -pthread -o /tmp/seg-cost scripts/seg-cost.c
//   /tmp/seg-cost 0 0 0          1 MiB write()s (the plain pump)
//   /tmp/seg-cost P H 1 [FLAGS]   1 MiB as messages of H header bytes + P payload
//                                 + 4 trailer bytes, one sendmsg each with FLAGS
//                                 (default MSG_EOR = 128; 0: none; the last of each
//                                 MiB always MSG_EOR)
//   LOWAT=N /tmp/seg-cost ...      SO_RCVLOWAT N on the receiving socket
// Prints Gbit/s over 2 s.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
#include <sys/mman.h>
static int port;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void *rx(void *a){int l=*(int*)a;int s=accept(l,0,0); int lw=getenv("LOWAT")?atoi(getenv("LOWAT")):0; if(lw) setsockopt(s,SOL_SOCKET,SO_RCVLOWAT,&lw,sizeof lw);char *b=mmap(0,1<<20,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);memset(b,0,1<<20);
 long tot=0;for(;;){ssize_t n=recv(s,b,1<<20,0);if(n<=0)break;tot+=n;} close(s);return 0;}
int main(int argc,char**argv){
 int P=atoi(argv[1]); int hdr=atoi(argv[2]); int mode=atoi(argv[3]); int fl=argc>4?atoi(argv[4]):MSG_EOR; /*0 plain write 1MiB, 1 fpdu iov sendmsg per fpdu, 2 fpdu iov one writev*/
 int l=socket(AF_INET,SOCK_STREAM,0);struct sockaddr_in sa={.sin_family=AF_INET,.sin_addr.s_addr=htonl(0x7f000001)};
 bind(l,(void*)&sa,sizeof sa);socklen_t sl=sizeof sa;getsockname(l,(void*)&sa,&sl);listen(l,1);
 pthread_t t;pthread_create(&t,0,rx,&l);
 int s=socket(AF_INET,SOCK_STREAM,0);setsockopt(s,IPPROTO_TCP,TCP_CONGESTION,"cubic",5);connect(s,(void*)&sa,sizeof sa);
 char *src=mmap(0,1<<20,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);memset(src,1,1<<20);
 char h[64]={0}; char tr[8]={0};
 double t0=now(); long tot=0;
 while(now()-t0<2.0){
  if(mode==0){ long off=0; while(off<(1<<20)){ssize_t n=write(s,src+off,(1<<20)-off); off+=n;} tot+=1<<20; }
  else { long off=0; while(off<(1<<20)){ int p=P; if(off+p>(1<<20)) p=(1<<20)-off;
     struct iovec iv[3]={{h,hdr},{src+off,p},{tr,4}}; struct msghdr m={.msg_iov=iv,.msg_iovlen=3};
     long want=hdr+p+4, done=0; while(done<want){ ssize_t n=sendmsg(s,&m,(off+p>=(1<<20))?MSG_EOR:fl); if(n<0){perror("send");exit(1);} done+=n; /*advance*/ long k=n; while(k>0){ if(k>=(long)m.msg_iov[0].iov_len){k-=m.msg_iov[0].iov_len;m.msg_iov++;m.msg_iovlen--;} else {m.msg_iov[0].iov_base=(char*)m.msg_iov[0].iov_base+k;m.msg_iov[0].iov_len-=k;k=0;} } }
     off+=p; } tot+=1<<20; }
 }
 double dt=now()-t0; shutdown(s,SHUT_WR); pthread_join(t,0);
 printf("P=%d hdr=%d mode=%d %.1f Gbit/s\n",P,hdr,mode,tot*8/dt/1e9); return 0;}
