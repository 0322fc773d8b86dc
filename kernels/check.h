// The operand checks the op families use are the engine's (engine/check.h), shared with the
// engine's own elementwise ops; the families include them through this header.
#pragma once
#include "engine/check.h"
