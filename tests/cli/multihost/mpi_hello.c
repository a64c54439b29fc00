/* mpi_hello.c - proof program for netns_mpirun.sh.
 *
 * Each rank prints its rank, the world size, the processor name, its
 * network namespace (/proc/self/ns/net), its node-local rank/size as
 * OpenMPI sees it (MPI_COMM_TYPE_SHARED), and the result of an
 * MPI_Allreduce(SUM) over a 1M-float buffer (4 MiB), which has to cross
 * the veth pair between the two namespaces when run by netns_mpirun.sh,
 * and whether MPI_THREAD_MULTIPLE was provided. Exits 3 on a wrong sum.
 *
 * Options (for testing the launcher itself):
 *   --exit N     after MPI_Finalize, rank 0 exits with status N
 *   --hang       rank 0 sleeps forever before finalizing (timeout test)
 *   --count N    number of floats (default 1048576)
 *
 * Build: mpicc -O2 -o /tmp/mpi_hello tests/cli/multihost/mpi_hello.c
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int exit_code = 0, hang = 0;
    long count = 1L << 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--exit") && i + 1 < argc)
            exit_code = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hang"))
            hang = 1;
        else if (!strcmp(argv[i], "--count") && i + 1 < argc)
            count = atol(argv[++i]);
    }

    /* Brigade asks for MPI_THREAD_MULTIPLE (its watchdog needs it): check the
     * TCP-only transport gives it. */
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank, size, len, local_rank, local_size;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);

    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank,
                        MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &local_rank);
    MPI_Comm_size(local, &local_size);

    char netns[64] = "?";
    ssize_t n = readlink("/proc/self/ns/net", netns, sizeof netns - 1);
    if (n > 0) netns[n] = '\0';

    float *buf = malloc((size_t)count * sizeof *buf);
    if (!buf) { fprintf(stderr, "rank %d: malloc failed\n", rank); MPI_Abort(MPI_COMM_WORLD, 2); }
    for (long i = 0; i < count; i++) buf[i] = (float)(rank + 1);

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double dt = MPI_Wtime() - t0;

    /* sum over ranks of (r+1) = size*(size+1)/2, exact in float here */
    float expect = (float)size * (float)(size + 1) / 2.0f;
    long bad = 0;
    for (long i = 0; i < count; i++) if (buf[i] != expect) bad++;

    printf("rank %d/%d host=%s netns=%s local=%d/%d thread_multiple=%s allreduce[%ld floats]=%g expect=%g %s %.1f ms\n",
           rank, size, name, netns, local_rank, local_size,
           provided == MPI_THREAD_MULTIPLE ? "yes" : "no", count,
           (double)buf[0], (double)expect, bad ? "MISMATCH" : "OK", dt * 1e3);
    fflush(stdout);
    free(buf);

    if (hang && rank == 0) for (;;) sleep(1);

    long allbad = 0;
    MPI_Allreduce(&bad, &allbad, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_free(&local);
    MPI_Finalize();
    if (allbad) return 3;
    return rank == 0 ? exit_code : 0;
}
