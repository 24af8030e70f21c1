/* Log-softmax of one row (include/tidal/logprob.h). */
#include "tidal/logprob.h"
#include "tidal/formats.h"

#include <math.h>

/* the e^(x - max) are taken a block at a time by td_exp_row (exp's bits, four at a time) and
 * summed in index order, as one loop of exp() would */
double td_log_sum_exp(const float *row, int V)
{
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    if (mx == -INFINITY) return 0;
    double sum = 0, e[TD_EXP_ROW_BLOCK];
    for (int v0 = 0, n; v0 < V; v0 += n) {
        n = (int)td_exp_row_block(row + v0, mx, e, (size_t)(V - v0));
        for (int i = 0; i < n; i++) sum += e[i];
    }
    return mx + log(sum);
}

void td_log_softmax(float *row, int V)
{
    float lse = (float)td_log_sum_exp(row, V);
    for (int v = 0; v < V; v++) row[v] -= lse;
}
