"""Named strategies (BP, MP, Z2, Z3, EMB, MQ, SP) acting on the anatomy's roles."""
