// placeholder: the profiled cost model
#include "gfdit/cost.h"
