"""pmkb's bundled data, installed as the package ``pmkb_data``: taxonomy, signatures, calibration, incidents."""
