// e2b 2.51.0: creates with POST /v2/sandboxes, connects with /v2/.../connect.
import * as sdk from 'e2b'
import { suite } from './lib/suite.mjs'

suite('2.51.0', sdk)
