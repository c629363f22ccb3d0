"""sempar.calibrate: measure the operator blocks the serving forecast prices on the local device
(`sempar calibrate`), convert measurement lines into an accelerator profile, and check the
forecast against measurements (`sempar calibrate check`). The profile format and the forecast's
use of it live in sempar.serving (accel_profile.py, calibration.py); this package only writes and
checks profiles. PyTorch is imported only where a device is measured (measure.py)."""
