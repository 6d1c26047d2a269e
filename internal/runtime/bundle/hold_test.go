package bundle

// The test binary stands in for `agentbox __hook hold`, which nsjoin's
// constructor runs.
import _ "github.com/agentbox/agentbox/internal/runtime/nsjoin"
