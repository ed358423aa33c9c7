// placeholder: the analytic cost model
#include "gfdit/cost.h"
