"""The backend contract and the engine-agnostic code backends share."""
