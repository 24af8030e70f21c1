/* What the paths layer's files share among themselves (not part of libtidal's API). */
#ifndef TIDAL_PATHS_INTERNAL_H
#define TIDAL_PATHS_INTERNAL_H

#include <stdio.h>

#include "tidal/model.h"

/* The vocabulary size of the session's model: the length of its rows. */
int session_vocab(const td_session *s);
/* Where long work on the session's model reports progress (m->progress; NULL: silent). */
FILE *session_progress(const td_session *s);

#endif
