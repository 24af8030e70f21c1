/* Log-softmax of one row (include/tidal/logprob.h). */
#include "tidal/logprob.h"

#include <math.h>

double td_log_sum_exp(const float *row, int V)
{
    float mx = -INFINITY;
    for (int v = 0; v < V; v++) mx = row[v] > mx ? row[v] : mx;
    if (mx == -INFINITY) return 0;
    double sum = 0;
    for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
    return mx + log(sum);
}

void td_log_softmax(float *row, int V)
{
    float lse = (float)td_log_sum_exp(row, V);
    for (int v = 0; v < V; v++) row[v] -= lse;
}
