// e2b 2.50.0: creates with POST /sandboxes (secure:true), connects with /sandboxes/{id}/connect.
import * as sdk from 'e2b-250'
import { suite } from './lib/suite.mjs'

suite('2.50.0', sdk)
